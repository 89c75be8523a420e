r"""A heterogeneous deployment of real Hugging Face checkpoints, by local path.

  python -m specjax.main --config=configs/real_models.py --workdir=runs/real \
      --config.verifier=/models/llama-3.1-70b-instruct \
      --config.drafters.code.path=/models/qwen2.5-coder-1.5b-instruct \
      --config.drafters.prose.path=/models/llama-3.2-3b-instruct \
      --config.drafters.reasoning.path=/models/mistral-7b-instruct-v0.3
  python -m specjax.main --config=configs/real_models.py:runlocal,mesh.model=4 ...

Each folder holds ``config.json``, ``*.safetensors`` (sharded or not) and
``tokenizer.json``; nothing is downloaded. Families (``architectures``): Llama, Qwen2,
Mistral (`specjax.models.hf`). Drafters of another tokenizer than the verifier's are
verified through the token-level intersection of the two vocabularies, matched by bytes
(`specjax.tokenizers.hf`). Parameters are streamed from the safetensors files straight
into their shards on the mesh.

Per-device memory (bf16 parameters and KV cache, batch 16 rows x 4096 positions;
`specjax.runner.deployments.hf.memory_table` prints it for the folders given, from their
config.json alone):

  ===========================  ===============  ===============  ===============
  model (params + KV cache)    tp, model=8      fsdp_tp, 2 x 4   fsdp, data=8
  ===========================  ===============  ===============  ===============
  verifier Llama-3.1-70B       16.43 + 2.50     16.43 + 2.50     16.43 + 2.50
  code Qwen2.5-Coder-1.5B       0.61 + 1.75      0.37 + 0.88      0.36 + 0.22
  prose Llama-3.2-3B            0.75 + 0.88      0.75 + 0.88      0.75 + 0.88
  reasoning Mistral-7B-v0.3     1.69 + 1.00      1.69 + 1.00      1.69 + 1.00
  total per device (GiB)          25.6             24.5             23.8
  ===========================  ===============  ===============  ===============

(`specjax.models.hf.estimate_bytes`: the largest per-device slice of every array. KV
heads that do not divide the 'model' axis are replicated, so under tp the 2-KV-head
Qwen2 keeps its whole cache on every device; 'fsdp' splits the batch 8 ways instead.)
A v5e chip has 16 GiB: the 70B verifier alone needs 16 of them (model=16); a v5p or an
H100 (95 / 80 GiB) holds the whole deployment on 8 with room for activations.

Variants: ``runlocal`` (2 plans per domain, 2 steps, small cache) for a smoke run, e.g.
on tiny random folders (tests/test_real_models_config.py builds them).
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.deployment = "hf"  # Hugging Face folders by local path (runner/deployments/hf.py)
    c.verifier = ""  # the verifier's folder (--config.verifier=PATH)
    c.drafters = (
        ml_collections.ConfigDict()
    )  # name -> folder, temperature, cost (None: params ratio)
    for name, temperature in (("code", 1.0), ("prose", 1.0), ("reasoning", 1.3)):
        d = ml_collections.ConfigDict()
        d.path = ""  # --config.drafters.<name>.path=PATH
        d.temperature = temperature  # sampling temperature τ_i
        d.cost = ml_collections.FieldReference(None, field_type=float)  # c_i; None: n_params ratio
        c.drafters[name] = d
    c.pad_vocab = True  # pad tokenizers to the embedding rows (Qwen2 rounds them up)
    c.bos = True  # prompts start with each tokenizer's BOS (its HF template)
    c.max_len = 4096  # KV-cache capacity / context of every model
    c.dtype = "bfloat16"  # compute and parameter dtype
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1  # mesh axis 'data' (batch rows; FSDP shards over it)
    c.mesh.model = 1  # mesh axis 'model' (tensor parallelism)
    c.rules = "fsdp_tp"  # logical-axis rules: tp | fsdp | fsdp_tp | replicated
    c.grid.pairing = [("code", "prose", "reasoning")]
    c.grid.policy = ["naive", "all_on"]
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.max_step_tokens = 16
    c.max_len = 256
    c.dtype = "float32"
    c.bucket = 32
    c.grid.policy = ["all_on"]


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
