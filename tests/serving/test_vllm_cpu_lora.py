"""vLLM's CPU build applies LoRA with Strop's grouped ops (platform/vllm_plugins/strop_vllm_cpu_lora.py),
and they compute what vLLM's own PyTorch ops compute, in vLLM's own virtualenv."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tests.fixtures.vllm import REPO_ROOT

pytestmark = pytest.mark.vllm

# Every case of the ops as vLLM calls them: one adapter for the whole batch, several, tokens of the
# base model (index -1) beside an adapter's, weights with and without their extra dimension,
# written or added, a slice of a wider output, a padded output, and an output broadcast from one row.
CHECK = textwrap.dedent(
    """
    import itertools, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    from vllm.lora.ops.torch_ops import lora_ops as vllm_ops
    import strop_vllm_cpu_lora as grouped

    originals = {name: getattr(vllm_ops, name) for name in grouped.PATCHED}
    torch.manual_seed(0)
    slots, rank, width = 4, 16, 96
    index_cases = {
        "one adapter": lambda n: torch.full((n,), 2),
        "several": lambda n: torch.randint(0, slots - 1, (n,)),
        "base and adapter": lambda n: torch.where(torch.rand(n) < 0.5, -1, 1),
        "base only": lambda n: torch.full((n,), -1),
    }
    checked = 0
    for (case, indices_of), tokens, four_d, add in itertools.product(
        index_cases.items(), (1, 7, 33), (False, True), (False, True)
    ):
        indices = indices_of(tokens)
        a = torch.randn(slots, rank, width)
        b = torch.randn(slots, width + 8, rank)
        a[-1] = 0  # vLLM keeps the last slot empty for tokens without an adapter
        b[-1] = 0
        if four_d:
            a, b = a.unsqueeze(1), b.unsqueeze(1)
        x = torch.randn(tokens, width)
        h = torch.randn(tokens, rank)

        def both(name, template, args_with):
            outs = []
            for fn in (originals[name], getattr(grouped, name)):
                out = template.clone()
                fn(*args_with(out))
                outs.append(out)
            assert torch.allclose(outs[0], outs[1], atol=1e-4, rtol=1e-4), (name, case, tokens, four_d, add)

        both("bgmv_shrink", torch.randn(tokens, rank + 4), lambda out: (x, a, out, indices, 0.5))
        both("bgmv_expand", torch.randn(tokens, width + 8), lambda out: (h, b, out, indices, add))
        # Narrower than the adapter's output: vLLM's padding case.
        both("bgmv_expand", torch.randn(tokens, width), lambda out: (h, b, out, indices, add))
        slice_of = (h, b)
        both(
            "bgmv_expand_slice",
            torch.randn(tokens, 3 * (width + 8)),
            lambda out: (*slice_of, out, indices, width + 8, width + 8, add),
        )
        checked += 4
    # A single row of LoRA output added to every row of a wider output (vLLM's 'limit = 1' case).
    one = torch.randn(1, rank)
    rows = torch.randn(5, width + 8)
    expected, got = rows.clone(), rows.clone()
    originals["bgmv_expand"](one, b, expected, torch.tensor([1]), True)
    grouped.bgmv_expand(one, b, got, torch.tensor([1]), True)
    assert torch.allclose(expected, got, atol=1e-4, rtol=1e-4)

    # register() puts them where the CPU path looks them up.
    grouped.register()
    from vllm.lora.punica_wrapper import punica_cpu
    assert all(getattr(punica_cpu, name) is getattr(grouped, name) for name in grouped.PATCHED)
    assert all(getattr(vllm_ops, name) is getattr(grouped, name) for name in grouped.PATCHED)
    print("checked", checked + 1)
    """
)


def test_grouped_lora_ops_compute_what_vllms_own_ops_compute():
    python = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():  # the vllm fixtures build it; this test can run first
        subprocess.run(["bash", str(REPO_ROOT / "platform" / "vllm-env.sh")], check=True, capture_output=True)
    result = subprocess.run(
        [str(python), "-c", CHECK, str(REPO_ROOT / "platform" / "vllm_plugins")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "checked 193" in result.stdout, result.stdout


def test_the_vllm_server_loads_the_grouped_ops(vllm_server):
    """vllm.sh puts Strop's plugins on vLLM's path: the engine's process says it uses them."""
    assert vllm_server.log_path is not None, "a server the fixture started"
    log = vllm_server.log_path.read_text(errors="replace")
    assert "strop_vllm_cpu_lora: LoRA ops grouped by adapter" in log, vllm_server.log_tail()
