"""specjax: speculative decoding with heterogeneous drafters sharing one verifier.

The seed's public API is importable from the top level, as the field report writes it::

    from specjax import (SpeculativePrefixCollapseError, should_truncate_and_repropose,
                         execute_parallel_plan)
"""
from specjax.policy.boundary import (SpeculativePrefixCollapseError, execute_parallel_plan,
                                     should_truncate_and_repropose)

__version__ = "0.1.0"
__all__ = ["SpeculativePrefixCollapseError", "execute_parallel_plan",
           "should_truncate_and_repropose", "__version__"]
