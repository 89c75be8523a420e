"""Training: the zoo's next-token loop, the drafters distilled from a real verifier, and the
checkpoints both write.

loop           next-token training of any LM with ``logits_full`` (AdamW, resume, budget)
distill        drafters distilled from a real verifier's generations and soft targets
distill_eagle  the feature drafter trained on the verifier's hidden states
checkpoints    orbax directories for training, single ``.npz`` files for shipping (the zoo
               loader, `specjax.models.zoo`, reads them)
"""
