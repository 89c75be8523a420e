"""The typed deployment kind (SPEC §12): what a caller asks of ``config.deployment``, never its
name.

A `DeploymentKind` says how a `plans` config that names it is checked and loaded: the config
fields it reads beyond the plans defaults (`fields`), its values (`check_values`), the
deployment checked without loading weights (`validate`: the run's inputs and the drafter
names a pairing may use), the deployment itself (`load`, a pairing's or the full one; with
``weights=False`` the outline validation budgets the context from), the plan prompts and
their domains, and what the reports and scripts ask (`pretrained`, `weight_layouts`,
`describe_verifier`). A
module of `specjax/runner/deployments/` defines one kind and passes an instance to `register`
when it is imported; the package's ``__init__`` imports every such module (its one
registration line) and answers the callers (`deployments.get(name)`, `deployments.known()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specjax.data import load_prompts
from specjax.engine.deployment import Deployment
from specjax.errors import ConfigError

__all__ = ["MAX_LEN", "DeploymentKind", "check_pairings", "register", "registered", "unregister"]

#: Upper bound of a config's ``max_len`` (a real verifier's context), before a kind checks it
#: against the model's own.
MAX_LEN = 1 << 20

#: Every registered kind, by name, in registration order (filled by `register`).
_KINDS: dict[str, "DeploymentKind"] = {}


class DeploymentKind:
    """One deployment kind: a verifier and its drafters as a config describes them.

    A kind subclasses this, sets the class attributes and overrides `validate` and `full`
    (or `load`); the other methods hold the common answer.

    Attributes:
        name: the value of ``config.deployment`` that picks it.
        fields: the config fields it reads beyond the `plans` defaults (the runner accepts
            the fields of every registered kind).
        refuses_other_fields: a field another kind reads and this one does not is refused
            (one line naming it); False: ignored.
        pretrained: its verifier is a pretrained model: wall clock is the primary throughput
            figure where its rounds are memory-bound (`runner.regime`).
        weight_layouts: its verifier loads in the weight layout a script's ``--dtype`` names
            (`specjax.models.gguf.parse_layout`, e.g. ``bfloat16:out_first``): the speed
            scripts' ``--verifier`` choices that take one.
        summary: one line for docs and error messages.
    """

    name: str = ""
    fields: tuple[str, ...] = ()
    refuses_other_fields: bool = True
    pretrained: bool = False
    weight_layouts: bool = False
    summary: str = ""

    # -------------------------------------------------------------------------- checks

    def check_values(self, config) -> None:
        """The kind's own fields' types and ranges, before anything loads (one `ConfigError`
        naming the field). Default: the fields of other kinds refused
        (`refuses_other_fields`)."""
        self.check_fields(config)

    def check_fields(self, config) -> None:
        """Refuses a field another registered kind reads and this one does not, naming the
        kinds that read it (unless `refuses_other_fields` is False)."""
        if not self.refuses_other_fields:
            return
        for field in config:
            owners = [k.name for k in _KINDS.values() if k is not self and field in k.fields]
            if owners and field not in self.fields:
                raise ConfigError.invalid(
                    field,
                    config[field],
                    f"no such field with deployment {self.name!r} "
                    f"({' or '.join(owners)} configs only)",
                )

    def validate(self, config) -> tuple[dict | None, set[str]]:
        """Checks what the config names (folders, files, wheels) without loading weights.

        Returns:
            (the run's inputs besides the config — what it came from, sha256s — or None,
            the drafter names a ``grid.pairing`` may use).
        """
        raise NotImplementedError(f"deployment kind {self.name!r}: validate")

    # -------------------------------------------------------------------------- loading

    def full(self, config) -> Deployment:
        """The full deployment the config describes (every drafter it names)."""
        raise NotImplementedError(f"deployment kind {self.name!r}: full")

    def load(
        self, config, pairing: Sequence[str] | None = None, weights: bool = True
    ) -> Deployment | None:
        """The deployment a cell runs: the `pairing`'s drafters in its order (None: the full
        deployment). ``weights=False`` (validation): the deployment the cell would run, or
        an outline of it (same tokenizers and contexts, no weights read), or None when the
        kind cannot build one without reading weights: validation then takes the drafter
        names from `drafter_names` and the verifier's context from `context`. Default: the
        full deployment, subset to the pairing."""
        dep = self.full(config)
        return dep.subset(list(pairing)) if pairing else dep

    def drafter_names(self, config) -> list[str]:
        """The full deployment's drafters, for a kind whose `load` has no outline."""
        raise NotImplementedError(f"deployment kind {self.name!r}: drafter_names")

    def context(self, config) -> int:
        """The verifier's context (positions), for a kind whose `load` has no outline."""
        raise NotImplementedError(f"deployment kind {self.name!r}: context")

    # -------------------------------------------------------------------------- prompts

    def plans_limit(self, config) -> tuple[int, str]:
        """(the most plans per domain a config may ask, the reason). Default: the plan
        prompts shipped per domain."""
        counts: dict[str, int] = {}
        for p in load_prompts():
            counts[p["domain"]] = counts.get(p["domain"], 0) + 1
        return min(counts.values()), "the plan prompts shipped per domain"

    def plan_prompts(self, config) -> tuple[list[str], list[str]]:
        """(prompts, ids): ``plans_per_domain`` prompts of each domain, interleaved (mixed
        plans). Default: the prompts shipped (`specjax.data.load_prompts`)."""
        n = int(config.plans_per_domain)
        by_domain: dict[str, list[dict]] = {}
        for p in load_prompts():
            by_domain.setdefault(p["domain"], []).append(p)
        picked = [
            by_domain[d][i] for i in range(n) for d in sorted(by_domain) if i < len(by_domain[d])
        ]
        return [p["prompt"] for p in picked], [p["id"] for p in picked]

    def plan_domains(self, config, ids: Sequence[str]) -> list[str]:
        """Each plan's domain (the oracle router needs it; the policies are not told)."""
        dom = {p["id"]: p["domain"] for p in load_prompts()}
        return [dom[i] for i in ids]

    # -------------------------------------------------------------------------- reports

    #: A kind whose verifier is one GGUF file: the model's name, and `validate`'s inputs
    #: hold ``{name: {'gguf': path, 'gguf_sha256': hex}}`` under the kind's name.
    gguf_verifier: str = ''

    def describe_verifier(self, config: dict, inputs: dict) -> str:
        """The verifier a run used, in words for a report, from its config and its rows'
        inputs record (what `validate` returned)."""
        g = inputs.get(self.name) if self.gguf_verifier else None
        if g is None:
            return f"{self.name}'s verifier (not recorded in the rows)"
        return (
            f"{self.gguf_verifier}, `{Path(str(g.get('gguf'))).name}` (sha256 "
            f"{str(g.get('gguf_sha256'))[:12]}…; rows' inputs.{self.name})"
        )

    def __repr__(self) -> str:
        return f"<deployment kind {self.name!r}>"


def check_pairings(config, known: set[str]) -> None:
    """Every ``grid.pairing`` is a non-empty list of distinct names from `known`."""
    for pairing in list(config.grid.get("pairing", [None])):
        if pairing is None:
            continue
        if not isinstance(pairing, (list, tuple)):
            raise ConfigError.invalid("grid.pairing", pairing, "lists of drafter names")
        names = list(pairing)
        if not names or len(set(map(str, names))) != len(names):
            raise ConfigError.invalid(
                "grid.pairing", pairing, "non-empty lists of distinct drafter names"
            )
        for n in names:
            if n not in known:
                raise ConfigError.invalid("grid.pairing", n, sorted(known))


def register(kind: DeploymentKind) -> DeploymentKind:
    """Adds `kind` to the registry (a name registered twice is an error) and returns it."""
    if not isinstance(kind, DeploymentKind):
        raise TypeError(f"register: got {type(kind).__name__}, expected a DeploymentKind")
    if not kind.name or not isinstance(kind.name, str):
        raise ValueError(f"register: {kind!r} has no name")
    if kind.name in _KINDS:
        raise ValueError(f"register: a deployment kind named {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Removes the kind named `name` (a test's own kind, after the test)."""
    _KINDS.pop(name, None)


def registered() -> dict[str, DeploymentKind]:
    """The registered kinds by name (a copy), in registration order."""
    return dict(_KINDS)
