"""Converting a dense model into a hashed allocation (least squares), and writing one back out as plain
weights (`--format hf --unroll`) or as the npas model type (which rebuilds the mapping from its seed)."""

from __future__ import annotations

import pytest
import torch

from npas.allocation.config import ArchConfig, Bank, Chassis, block_slots, reference_config
from npas.allocation.transformer import build_model
from npas.conversion import convert_model

CH = Chassis(vocab_size=68, context=32, d_model=32, n_layers=3, n_heads=4, d_ff=96)
IDS = torch.randint(0, 68, (2, 24), generator=torch.Generator().manual_seed(0))


def _global(ch: Chassis, frac: float, tile: int = 16, seed: int = 11) -> ArchConfig:
    ref = reference_config(ch)
    members = tuple((b, s) for b in range(ch.n_layers) for s in block_slots(ch.activation))
    n = sum(ref.member_numels(Bank(members, "tie", 1)))
    return ArchConfig(chassis=ch, mlp_widths=ref.mlp_widths, block_of_layer=ref.block_of_layer,
                      banks=(Bank(members, "hash", size=int(frac * n), tile=tile, seed=seed),))


def _dense(ch: Chassis) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(reference_config(ch)).eval()


def test_a_dense_model_converts_into_the_collision_free_hashed_allocation_exactly():
    dense = _dense(CH)
    conv = convert_model(dense, _global(CH, 1.0))
    assert torch.equal(conv.model.eval()(IDS)[0], dense(IDS)[0])
    assert "sign-corrected mean" in str(conv.provenance.to_dict())


def test_a_smaller_array_is_the_least_squares_fit_of_the_dense_weights():
    dense = _dense(CH)
    cfg = _global(CH, 0.3)
    conv = convert_model(dense, cfg)
    bank = conv.model.banks[0]
    want = torch.cat([dense.blocks[b].get_parameter(s).detach().reshape(-1) for b, s in cfg.banks[0].members])
    array = bank.weight.detach().clone().requires_grad_(True)
    index, sign = bank.element_index()
    err = ((sign * array[index] - want) ** 2).sum()
    err.backward()
    assert array.grad.abs().max() < 1e-5  # stationary: the least-squares solution
    assert 0.1 < float(err.detach().sqrt() / want.norm()) < 1.0  # lossy at 0.3x, but far from nothing
    # the npas fit beats a naive one (the first reader of each element, unsigned)
    naive = torch.zeros_like(array).index_copy_(0, index.flip(0), want.flip(0))
    assert float(((sign * naive[index] - want) ** 2).sum()) > float(err)


LLAMA = Chassis(vocab_size=68, context=32, d_model=32, n_layers=2, n_heads=4, d_ff=64, activation="swiglu",
                family="llama", n_kv_heads=2, tie_embeddings=False)


def test_hf_unroll_materialises_plain_weights_and_the_npas_type_rebuilds_the_mapping(tmp_path):
    transformers = pytest.importorskip("transformers")
    import npas  # noqa: F401  (registers the npas model type with the Auto classes)
    from npas.conversion.hf_export import write_hf

    cfg = _global(LLAMA, 0.4, seed=1234)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    want = model(IDS)[0]
    assert write_hf(model, cfg, tmp_path / "un", unroll=True)["kind"] == "llama"
    stock = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "un").eval()
    with torch.no_grad():
        assert (stock(IDS).logits - want).abs().max().item() <= 1e-5
    assert write_hf(model, cfg, tmp_path / "npas")["kind"] == "npas"
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "npas").eval()
    with torch.no_grad():
        assert (back(IDS).logits - want).abs().max().item() <= 1e-5


def test_trained_from_the_same_weights_the_collision_free_model_follows_the_dense_one():
    """At 1x the array is a signed permutation of the dense weights, every fair multiplier is 1 (k = 1 at
    the reference's shapes), and AdamW, weight decay and global-norm clipping act elementwise or see only
    norms, so the converted model trained on the same batches must follow the dense model step for step,
    up to float rounding. What separates the two arms in a seed-paired comparison at one rate is then only
    their independent random initialisations."""
    from npas.training.data import load_corpus
    from npas.training.proxy import make_trainer
    from npas.training.recipe import Recipe

    recipe = Recipe(name="hash-1x", seq_len=16, batch_size=4, steps=12, lr=2e-2, min_lr=2e-3, warmup_steps=2,
                    eval_every=12, eval_batches=1, threads=1, grad_clip=0.5)  # clipping active at lr 2e-2
    corpus = load_corpus()
    dense = _dense(CH).train()
    conv = convert_model(dense, _global(CH, 1.0)).model.train()
    start = {k: v.clone() for k, v in dense.state_dict().items()}
    trainers = [make_trainer(m, recipe, corpus, torch.device("cpu")) for m in (dense, conv)]
    for tr in trainers:
        tr.advance(recipe.steps, recipe.steps)
    moved = max(float((v - start[k]).abs().max()) for k, v in dense.state_dict().items())
    assert moved > 1e-2  # the run trained
    with torch.no_grad():
        torch.testing.assert_close(conv.eval()(IDS)[0], dense.eval()(IDS)[0], rtol=0, atol=1e-4)
        weights = conv.materialise()
        for b, block in enumerate(dense.blocks):
            for slot in block_slots(CH.activation):
                torch.testing.assert_close(weights[b][slot], block.get_parameter(slot), rtol=0, atol=1e-5)
