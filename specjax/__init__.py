"""specjax: speculative decoding with heterogeneous drafters sharing one verifier."""
__version__ = "0.1.0"
