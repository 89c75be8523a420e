"""specjax: speculative decoding with heterogeneous drafters sharing one verifier.

The seed's public API is importable from the top level, as the field report writes it::

    from specjax import (SpeculativePrefixCollapseError, should_truncate_and_repropose,
                         execute_parallel_plan)

Those names are resolved on first use (PEP 562), so that importing a submodule
(``import specjax.errors``) does not import the policy layer or JAX.
"""

__version__ = "0.1.0"
__all__ = [
    "SpeculativePrefixCollapseError",
    "execute_parallel_plan",
    "should_truncate_and_repropose",
    "__version__",
]

_SEED_API = (
    "SpeculativePrefixCollapseError",
    "execute_parallel_plan",
    "should_truncate_and_repropose",
)


def __getattr__(name: str):
    if name in _SEED_API:
        from specjax.policy import boundary  # pylint: disable=import-outside-toplevel

        value = getattr(boundary, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'specjax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SEED_API))
