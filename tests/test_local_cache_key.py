"""torch's local compile caches must miss after speedrun's sources change.

Inductor's FX-graph cache keys a graph by its traced text, torch and the
Inductor config, not by a custom op's Python body or fake kernel. When an op
keeps its name but its outputs change (as the fused head's op did), a graph
compiled against the old fake kernel is reused and fails at its first call.
`compile_cache.key_local_caches` puts speedrun's source hash into that key
through a no-op custom graph pass. Each case runs in a fresh process sharing
one cache folder, as two runs of two speedrun versions on one machine would.
"""

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(r'''
    import sys
    import torch
    from torch import Tensor
    from speedrun.compile import cache as compile_cache

    version, key = sys.argv[1], sys.argv[2]
    if key != "none":
        assert compile_cache.key_local_caches(key)

    @torch.library.custom_op("cachekeytest::f", mutates_args=())
    def f(x: Tensor) -> tuple[Tensor, Tensor]:
        return x * 2, (x.new_zeros(0) if version == "1" else x.new_zeros(x.shape))

    @f.register_fake
    def _(x):
        return x.new_empty(x.shape), (x.new_empty(0) if version == "1" else x.new_empty(x.shape))

    def g(x):
        a, b = f(x)
        return a + 1, b * 3  # b feeds a generated kernel, which relies on its compiled shape

    out = torch.compile(g, fullgraph=True)(torch.ones(4, 3))
    print("OK", tuple(out[1].shape))
''')


def _run(tmp_path, version: str, key: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    return subprocess.run([sys.executable, "-c", _SCRIPT, version, key], env=env, capture_output=True, text=True,
                          timeout=600)


def test_without_the_key_a_changed_op_reuses_a_stale_graph(tmp_path):
    """The hazard itself (so the next test can fail): version 2 of the op hits version 1's graph."""
    first = _run(tmp_path, "1", "none")
    assert first.returncode == 0 and "OK (0,)" in first.stdout, first.stderr[-2000:]
    second = _run(tmp_path, "2", "none")
    if second.returncode == 0 and "OK (4, 3)" in second.stdout:
        pytest.skip("this torch keys its cache by the custom op too: no hazard to guard against")
    # the stale graph either fails its shape check or computes with version 1's shapes
    assert second.returncode != 0 or "OK (0,)" in second.stdout, (second.stdout, second.stderr[-2000:])


def test_source_key_makes_the_changed_op_compile_afresh(tmp_path):
    first = _run(tmp_path, "1", "sources-v1")
    assert first.returncode == 0 and "OK (0,)" in first.stdout, first.stderr[-2000:]
    second = _run(tmp_path, "2", "sources-v2")
    assert second.returncode == 0 and "OK (4, 3)" in second.stdout, second.stderr[-2000:]
    again = _run(tmp_path, "2", "sources-v2")  # same sources: still a valid run (a cache hit)
    assert again.returncode == 0 and "OK (4, 3)" in again.stdout, again.stderr[-2000:]


def test_a_users_own_pass_is_left_alone():
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from speedrun.compile import cache as compile_cache

    class Mine(CustomGraphPass):
        def __call__(self, graph):
            return None

        def uuid(self):
            return "mine"

    old = config.post_grad_custom_post_pass
    try:
        config.post_grad_custom_post_pass = None
        assert compile_cache.key_local_caches("k1")
        assert config.post_grad_custom_post_pass.uuid() == "k1"
        assert compile_cache.key_local_caches()  # ours is replaced: the source hash by default
        assert config.post_grad_custom_post_pass.uuid() == compile_cache.source_hash()
        config.post_grad_custom_post_pass = Mine()
        assert not compile_cache.key_local_caches("k2")
        assert config.post_grad_custom_post_pass.uuid() == "mine"
    finally:
        config.post_grad_custom_post_pass = old
