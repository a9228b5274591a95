"""Left-padded batches (issue 37, gap a): an attention_mask gives each row its own positions and hides
padding keys, so a batch of prompts of different lengths generates what each prompt generates alone.

Checked on npas's own forward (llama and classic chassis; plain, with KV sharing, with a cache) and
through the registered `NpasForCausalLM` under `generate()`, whose cache keeps only KV source layers.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

import npas  # noqa: E402,F401  (registers the npas model type with the Auto classes)
from npas.allocation.config import ArchConfig, Chassis, reference_config  # noqa: E402
from npas.allocation.transformer import build_model  # noqa: E402
from npas.conversion.hf_convert import convert_hf_dir  # noqa: E402
from npas.conversion.hf_source import read_hf_dir  # noqa: E402
from tests.conversion.test_hf import V, make_llama  # noqa: E402

PAD = 0


def left_pad(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask), each (B, longest), prompts right-aligned behind PAD tokens."""
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), PAD)
    mask = torch.zeros(len(prompts), n, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, n - len(p):] = p
        mask[i, n - len(p):] = 1
    return ids, mask


def prompts(lengths=(7, 3, 5), seed=3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (n,), generator=g) for n in lengths]


def shared(cfg: ArchConfig) -> ArchConfig:
    d = cfg.to_dict()
    d.update(block_of_layer=[0, 1, 0], lora_attn=[4, 4, 4], kv_source=[0, 0, 2], kv_mode="v")
    return ArchConfig.from_dict(d)


def classic() -> ArchConfig:
    return reference_config(Chassis(vocab_size=V, context=32, d_model=32, n_layers=3, n_heads=4, d_ff=64))


@pytest.mark.parametrize("family", ["llama", "classic"])
def test_padded_rows_give_each_prompts_own_logits(tmp_path, family):
    if family == "llama":
        make_llama(tmp_path / "src", tied=True)
        cfg = shared(read_hf_dir(tmp_path / "src").cfg)
    else:
        cfg = shared(classic())
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    ps = prompts()
    ids, mask = left_pad(ps)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)[0]
        assert torch.isfinite(batched).all()  # padding rows too: no NaN leaks through shared values
        for i, p in enumerate(ps):
            alone = model(p[None])[0][0]
            assert (batched[i, -len(p):] - alone).abs().max().item() <= 1e-5
        unmasked = model(ids)[0]  # the mask matters: without it the shorter rows read padding
        assert (unmasked[1, -len(ps[1]):] - batched[1, -len(ps[1]):]).abs().max().item() > 1e-3
        # an all-ones mask is the unmasked forward
        assert torch.equal(model(ids, attention_mask=torch.ones_like(mask))[0], model(ids)[0])


def test_padded_rows_decode_incrementally_with_a_cache(tmp_path):
    make_llama(tmp_path / "src", tied=True)
    model = build_model(shared(read_hf_dir(tmp_path / "src").cfg)).eval()
    ps = prompts()
    ids, mask = left_pad(ps)
    nxt = torch.randint(1, V, (3, 2), generator=torch.Generator().manual_seed(5))
    full_ids, full_mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
    with torch.no_grad():
        whole = model(full_ids, attention_mask=full_mask)[0]
        cache = DynamicCache()
        first = model(ids, cache=cache, attention_mask=mask)[0]
        step = model(nxt[:, :1], cache=cache, attention_mask=full_mask[:, :-1])[0]
        last = model(nxt[:, 1:], cache=cache, attention_mask=full_mask)[0]
        real = full_mask.bool()
        assert (torch.cat([first, step, last], 1) - whole)[real].abs().max().item() <= 1e-5
        with pytest.raises(ValueError, match="attention_mask has shape"):
            model(nxt[:, :1], cache=cache, attention_mask=mask)


def test_batched_generate_with_padding_equals_per_prompt_generate(tmp_path):
    src = tmp_path / "src"
    make_llama(src)  # untied: a tied random model greedily repeats its last token whatever it reads
    cfg = shared(read_hf_dir(src).cfg)
    convert_hf_dir(src, cfg, tmp_path / "hf", fmt="hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ps = prompts()
    ids, mask = left_pad(ps)
    n = ids.shape[1]
    with torch.no_grad():
        for use_cache in (True, False):
            batched = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD,
                                  use_cache=use_cache)
            for i, p in enumerate(ps):
                alone = hf.generate(p[None], max_new_tokens=8, do_sample=False, pad_token_id=PAD)
                assert torch.equal(batched[i, n:], alone[0, len(p):]), (use_cache, i)
        # without the mask the padded rows would read their padding and generate otherwise
        assert not torch.equal(hf(ids).logits.argmax(-1)[:, -1], batched[:, n])
