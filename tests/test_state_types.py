"""The engine's typed state (issue 49 item 2): keyword-built structs whose array shapes are
typed (jaxtyping) and checked by `check()` / `check_shapes`, at trace time only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing
from specjax.engine.autoregressive import ARInputs, autoregressive_generate
from specjax.engine.decode import RoundInputs
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.engine.state import ARState, Counters, DecodeState, EngineState, check_shapes


def test_counters_zeros_follow_their_annotations():
    c = Counters.zeros(2, 3, 4)
    c.check()
    shapes = {f.name: getattr(c, f.name).shape for f in dataclasses.fields(c)}
    assert shapes["rounds"] == (2,)
    assert shapes["proposed"] == (2, 3)
    assert shapes["own_accepted_at"] == (2, 3, 4)
    assert c.kept_rule1.dtype == jnp.float32 and c.catchups.dtype == jnp.int32


@pytest.mark.parametrize("cls", [Counters, DecodeState, EngineState, ARState, RoundInputs])
def test_structs_are_built_by_keyword(cls):
    with pytest.raises(TypeError):
        cls(jnp.zeros((1,), jnp.int32))


def test_check_names_the_field_whose_shape_disagrees():
    c = Counters.zeros(2, 3, 4)
    with pytest.raises(TypeError, match=r"Counters\.own_reached_at: got int32\[2, 3, 5\]"):
        c.replace(own_reached_at=jnp.zeros((2, 3, 5), jnp.int32)).check()
    with pytest.raises(TypeError, match=r"Counters\.rounds: got float32\[2\]"):
        c.replace(rounds=jnp.zeros((2,), jnp.float32)).check()


def test_dimension_names_bind_across_structs():
    """B is one size across the structs checked together: a round's inputs and its state."""
    inputs = RoundInputs(
        v_params={},
        d_data=(),
        slots=jnp.zeros((3, 1), jnp.int32),
        stop_table=jnp.zeros((5,), bool),
        max_new=jnp.zeros((2,), jnp.int32),
    )
    state = ARState(
        tokens=jnp.zeros((2, 8), jnp.int32),
        length=jnp.zeros((2,), jnp.int32),
        done=jnp.zeros((2,), bool),
        vcache=None,
    )
    state.check()
    with pytest.raises(TypeError, match=r"RoundInputs\.slots"):
        check_shapes(state, inputs)
    check_shapes(state, inputs.replace(slots=jnp.zeros((2, 1), jnp.int32)))


def test_check_at_trace_time_adds_nothing_to_the_program():
    c = Counters.zeros(2, 3, 4)

    def plain(c):
        return c.rounds + 1

    def checked(c):
        c.check()
        return c.rounds + 1

    assert str(jax.make_jaxpr(plain)(c)) == str(jax.make_jaxpr(checked)(c))


def test_a_calls_states_and_counters_pass_their_checks():
    """A speculative call and the autoregressive baseline continuing its state: every state
    they return is what its types say (the loops also check while tracing)."""
    dep, _ = testing.make_deployment("random", 0)
    prompts = [[1, 2, 3], [2, 4]]
    cfg = EngineConfig(gamma=2, rule="rejection", max_new_tokens=4)
    res = speculative_generate(
        cfg,
        dep.verifier,
        dep.v_params,
        dep.drafters[:1],
        dep.d_data[:1],
        prompts,
        [[testing.drafter_prompts(p)[0] for p in prompts]],
        row_keys_for(0, 2),
        reserve=4,
        return_state=True,
    )
    res.state.check()
    counters = jax.tree.map(jnp.asarray, res.counters)
    counters.check()
    assert counters.own_accepted_at.shape == (2, 1, 2)
    ar = autoregressive_generate(
        dep.verifier,
        dep.v_params,
        None,
        row_keys_for(0, 2),
        temperature=1.0,
        max_new_tokens=3,
        state=res.state,
        return_state=True,
    )
    ar.state.check()
    assert np.all(ar.length - ar.start <= 3)
    inputs = ARInputs.of(
        dep.v_params,
        jnp.asarray(row_keys_for(0, 2)),
        jnp.zeros((dep.verifier.vocab_size,), bool),
        jnp.float32(1.0),
        jnp.int32(3),
    )
    check_shapes(inputs, ar.state)
