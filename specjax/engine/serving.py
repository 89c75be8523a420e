"""A deployment as a device mesh serves it.

`serve_deployment` is `specjax.runtime.sharding.shard_deployment` with the verifier first put in
its served form (`specjax.models.kv_heads.serve_form`): its KV heads repeated until the
mesh's 'model' axis divides them, so tensor parallelism splits the cache by head instead
of gathering it every step; and, where programs are traced for a TPU
(`specjax.runtime.backend.platform`), a tied head stored as its own array (the TPU compiler
otherwise relays the tied table on every multi-row call). Parameters go on the mesh under
`specjax.runtime.sharding.decode_rules`: weights stay where they are at decode. The function is
unchanged: the same logits, the same tokens.
"""

from __future__ import annotations

import dataclasses

from specjax.models.kv_heads import serve_form
from specjax.runtime import backend
from specjax.runtime import sharding as shd

__all__ = ['serve_deployment']


def serve_deployment(dep, mesh, rules='tp', untie_head: bool | None = None):
    """``dep`` (an `specjax.engine.deployment.Deployment`) served on ``mesh`` by ``rules``
    (a `specjax.runtime.sharding.RULE_SETS` name or a rules tuple); ``untie_head`` None: on TPU."""
    untie = backend.platform() == 'tpu' if untie_head is None else bool(untie_head)
    v_lm, v_params = serve_form(dep.verifier, dep.v_params, int(mesh.shape['model']), untie)
    dep = dataclasses.replace(dep, verifier=v_lm, v_params=v_params)
    return shd.shard_deployment(dep, mesh, shd.decode_rules(rules))
