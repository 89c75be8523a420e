"""Deployment kinds (`specjax.runner.deployments`): the recipe of ARCHITECTURE.md's
"Adding a deployment kind", done from this file — a kind registered here is validated, its
fields accepted and refused, its prompts and limits used, and its deployment loaded by the
runner with no other module touched — and the registry's answers for the shipped kinds."""

from __future__ import annotations

import pytest

from specjax import testing
from specjax.configs.common import plans_defaults
from specjax.errors import ConfigError, check
from specjax.runner import deployments, plans_setup, plans_validation
from specjax.runner.deployments import DeploymentKind, register, unregister
from specjax.runner.regime import WALL_CLOCK_PRIMARY


class ToyKind(DeploymentKind):
    """Three exact table LMs of `specjax.testing` at a config's ``toy_seed``, two domains
    of prompts in their alphabet, at most 5 plans per domain."""

    name = "toy"
    fields = ("toy_seed",)
    summary = "exact tables at a seed (this test's kind)"

    def check_values(self, config) -> None:
        seed = config.get("toy_seed", 0)
        check(isinstance(seed, int) and seed >= 0, "toy_seed", seed, "an integer >= 0")
        self.check_fields(config)

    def validate(self, config):
        return {"toy": {"seed": config.get("toy_seed", 0)}}, set(self.full(config).names)

    def full(self, config):
        return testing.make_deployment("random", seed=config.get("toy_seed", 0))[0]

    def plans_limit(self, config):
        return 5, "the toy's prompts"

    def plan_prompts(self, config):
        prompts = ["ab", "ba", "cd", "dc", "abc", "dcb", "a", "d", "bb", "cc"]
        n = int(config.plans_per_domain)
        return prompts[: 2 * n], [f"{'xy'[i % 2]}{i}" for i in range(2 * n)]

    def plan_domains(self, config, ids):
        return [i[0] for i in ids]


@pytest.fixture
def toy():
    kind = register(ToyKind())
    yield kind
    unregister(kind.name)


def _config(**fields):
    c = plans_defaults()
    c.deployment = "toy"
    c.toy_seed = 3
    c.plans_per_domain = 2
    c.plan_steps = 1
    c.max_step_tokens = 4
    c.bucket = 8
    c.grid.pairing = [("d0", "d2")]
    c.grid.policy = ["all_on"]
    c.grid.gamma = [2]
    for key, value in fields.items():
        owner, _, field = key.rpartition(".")
        setattr(c.grid if owner == "grid" else c, field, value)
    return c


def _error(config) -> str:
    with pytest.raises(ConfigError) as e:
        plans_validation.validate(config)
    return str(e.value)


def test_a_kind_registered_from_a_test_file_runs_through_validation_and_setup(toy):
    config = _config()
    assert deployments.get("toy") is toy and "toy" in deployments.known()
    assert "toy_seed" in deployments.all_fields()
    # Validation asks the kind: its inputs, its drafter names, its prompts, its cells.
    assert plans_validation.validate(config) == {"toy": {"seed": 3}}
    prompts, ids = plans_setup.plan_prompts(config)
    assert prompts == ["ab", "ba", "cd", "dc"]
    assert plans_setup.plan_domains(config, ids) == ["x", "y", "x", "y"]
    dep = plans_setup.cell_deployment(
        config, {"pairing": ["d2", "d0"], "drafter_temperature": 0.5, "gamma": 2}
    )
    assert dep.names == ("d2", "d0") and {d.temperature for d in dep.drafters} == {0.5}
    assert plans_setup.load_deployment(config).names == ("d0", "d1", "d2")
    # The oracle router needs a drafter named after each of the kind's domains (x, y).
    assert "no drafter for the plan domain(s) ['x', 'y']" in _error(
        _config(**{"grid.policy": ["oracle"]})
    )


def test_a_registered_kinds_errors_name_its_field_value_and_allowed(toy):
    assert _error(_config(toy_seed=-1)) == "toy_seed: got -1, allowed: an integer >= 0"
    assert _error(_config(plans_per_domain=6)) == (
        "plans_per_domain: got 6, allowed: an integer >= 1 and <= 5 (the toy's prompts)"
    )
    assert _error(_config(**{"grid.pairing": [("d0", "d9")]})) == (
        "grid.pairing: got 'd9', allowed: one of 'd0', 'd1', 'd2'"
    )
    # Another kind's field is refused by name, the hf fields too (hf configs only).
    assert _error(_config(max_len=64)) == (
        "max_len: got 64, allowed: no such field with deployment 'toy' "
        "(gemma3 or hf or smollm2 configs only)"
    )
    # The toy's field is refused with a kind that refuses other kinds' fields.
    smol = _config(deployment="smollm2", dtype="float32", max_len=256)
    assert _error(smol) == (
        "toy_seed: got 3, allowed: no such field with deployment 'smollm2' (toy configs only)"
    )


def test_an_unknown_kind_is_refused_naming_the_registered_ones(toy):
    unregister("toy")
    config = _config()
    del config["toy_seed"]  # its field went with it
    msg = _error(config)
    assert msg.startswith("deployment: got 'toy', allowed: one of ")
    for name in ("zoo", "synthetic", "hf", "smollm2", "gemma3"):
        assert repr(name) in msg
    with pytest.raises(ConfigError, match="^--verifier: got 'nope', allowed: one of "):
        deployments.get("nope", "--verifier")
    register(toy)  # the fixture unregisters it


def test_registering_twice_or_not_a_kind_is_an_error(toy):
    with pytest.raises(ValueError, match="already registered"):
        register(ToyKind())
    with pytest.raises(TypeError, match="expected a DeploymentKind"):
        register("toy2")


def test_the_shipped_kinds_answer_what_callers_ask():
    assert set(deployments.known()) >= {"zoo", "synthetic", "hf", "smollm2", "gemma3"}
    assert set(WALL_CLOCK_PRIMARY) == {"hf", "smollm2", "gemma3"}  # their verifiers are pretrained
    assert [k.name for k in deployments.all_kinds() if k.weight_layouts] == ["smollm2"]
    synthetic = deployments.get("synthetic")
    c = plans_defaults()
    c.deployment, c.plans_per_domain = "synthetic", 1
    assert synthetic.plans_limit(c) == (64, "the synthetic deployment's limit")
    assert synthetic.plan_prompts(c) == (["ab", "cda", "b"], ["s0", "s1", "s2"])
    assert set(deployments.get("smollm2").fields) <= set(deployments.get("hf").fields)
    assert set(deployments.get("gemma3").fields) <= set(deployments.get("hf").fields)


def test_each_kind_describes_the_verifier_of_a_run_for_the_reports():
    zoo_inputs = {"zoo": {"source": "shipped", "manifest_sha256": "ab" * 32}}
    assert deployments.get("zoo").describe_verifier({}, zoo_inputs) == (
        "the zoo's verifier (shipped zoo, manifest sha256 abababababab…; rows' inputs.zoo)"
    )
    smol_inputs = {"smollm2": {"gguf": "/w/SmolLM2.gguf", "gguf_sha256": "cd" * 32}}
    assert deployments.get("smollm2").describe_verifier({}, smol_inputs) == (
        "SmolLM2-135M-Instruct, `SmolLM2.gguf` (sha256 cdcdcdcdcdcd…; rows' inputs.smollm2)"
    )
    assert deployments.get("hf").describe_verifier({"verifier": "/models/v"}, {}) == "/models/v"
    for name in deployments.known():
        assert deployments.get(name).describe_verifier({}, {}) == (
            f"{name}'s verifier (not recorded in the rows)"
        )
