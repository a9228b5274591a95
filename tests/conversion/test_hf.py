"""Hugging Face checkpoints in and out (issue 37): tiny random LlamaForCausalLMs built from configs, no hub.

In: identity conversion reproduces the source's logits (GQA; tied and untied heads; llama3 and linear
rope scaling; sharded weights; bf16) both through the converted npas model and through npas's own
forward of the directory it writes. Out: a tied + LoRA conversion written --format hf loads through
AutoModelForCausalLM and generates what npas's sampler generates; --unroll loads as a stock
LlamaForCausalLM with equal logits. Refusals: one line, exit 2, nothing written.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import npas  # noqa: E402,F401  (registers the npas model type with the Auto classes)
from npas.allocation.config import ArchConfig  # noqa: E402
from npas.conversion.hf_convert import convert_hf_dir  # noqa: E402
from npas.conversion.hf_source import read_hf_dir  # noqa: E402
from npas.presentation.cli import main  # noqa: E402
from npas.training.train import load_trained, sample  # noqa: E402

V = 300
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


@pytest.fixture(scope="module")
def tokenizer():
    from npas.training.data import bundled_text
    from npas.training.tokenizers import train_bpe

    tok = train_bpe(bundled_text()[:100_000], V)
    assert tok.vocab_size == V
    return tok


def make_llama(path, tokenizer=None, *, tied=False, kv=2, rope=None, dtype=torch.float32, shard=None,
               layers=3, seed=0, vocab=V, **extra):
    torch.manual_seed(seed)
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0} if rope is None else rope | {"rope_theta": 5e5}
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=64,
                      tie_word_embeddings=tied, rope_parameters=rope_parameters, **extra)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random norms too, so a misplaced gain shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model = model.to(dtype)
    kwargs = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(path, **kwargs)
    if tokenizer is not None:
        (path / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")
    return model


def ids(n=2, T=40, seed=1):
    return torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(seed))


CASES = {
    "gqa-untied": {"tied": False},
    "gqa-tied-llama3": {"tied": True, "rope": LLAMA3},
    "mha-linear-rope": {"kv": 4, "rope": {"rope_type": "linear", "factor": 2.0}},
    "sharded": {"shard": "20KB"},
}


@pytest.mark.parametrize("case", CASES)
def test_identity_conversion_reproduces_the_logits(tmp_path, case):
    src = tmp_path / "src"
    hf = make_llama(src, **CASES[case])
    if case == "sharded":
        assert (src / "model.safetensors.index.json").is_file() and len(list(src.glob("*.safetensors"))) > 1
    x = ids()
    with torch.no_grad():
        want = hf(x).logits
        got = read_hf_dir(src).model(x)[0]
    assert (got - want).abs().max().item() <= 1e-4
    res = convert_hf_dir(src, None, tmp_path / "out")  # no tokenizer.json: no loss pass, said in the note
    assert res.note is not None and "no tokenizer" in res.note
    with torch.no_grad():
        converted = res.conversion.model(x)[0]
    assert (converted - want).abs().max().item() <= 1e-4
    # npas's own forward of what it wrote (config.yaml + model.safetensors)
    from npas.allocation.transformer import build_model, load_weights

    text = (tmp_path / "out" / "config.yaml").read_text()
    model = build_model(ArchConfig.from_yaml(text))
    load_weights(model, tmp_path / "out" / "model.safetensors", text)
    with torch.no_grad():
        assert (model(x)[0] - want).abs().max().item() <= 1e-4


def test_bf16_source_keeps_its_dtype_and_its_logits(tmp_path):
    src = tmp_path / "src"
    hf = make_llama(src, dtype=torch.bfloat16, tied=True)
    ck = read_hf_dir(src)
    assert ck.dtype == "bfloat16" and next(ck.model.parameters()).dtype == torch.float32  # upcast for the fits
    res = convert_hf_dir(src, None, tmp_path / "out")
    assert res.conversion.cfg.dtype == "bfloat16"
    x = ids()
    with torch.no_grad():  # the bf16 weights, upcast, computed in fp32 on both sides
        want = hf.float()(x).logits
        assert (res.conversion.model(x)[0] - want).abs().max().item() <= 1e-4
    model, _, cfg = _load_npas(tmp_path / "out")
    assert next(model.parameters()).dtype == torch.bfloat16
    res32 = convert_hf_dir(src, None, tmp_path / "out32", dtype="float32")
    assert res32.conversion.cfg.dtype == "float32"


def _load_npas(d):
    from npas.allocation.transformer import build_model, load_weights

    text = (d / "config.yaml").read_text()
    cfg = ArchConfig.from_yaml(text)
    model = build_model(cfg)
    load_weights(model, d / "model.safetensors", text)
    return model, None, cfg


def tied_lora(cfg: ArchConfig) -> ArchConfig:
    d = cfg.to_dict()
    L = cfg.chassis.n_layers
    d.update(block_of_layer=[0] * L, lora_attn=[4] * L, lora_mlp=[4] * L)
    return ArchConfig.from_dict(d)


def test_tied_lora_written_hf_loads_and_generates_like_npas(tmp_path, tokenizer, capsys):
    src = tmp_path / "src"
    make_llama(src, tokenizer, tied=True)
    alloc = tmp_path / "tied.yaml"
    alloc.write_text(tied_lora(read_hf_dir(src).cfg).to_yaml())
    assert main(["convert", str(src), "--to", str(alloc), "--out", str(tmp_path / "npas"), "--quiet"]) == 0
    assert main(["convert", str(src), "--to", str(alloc), "--out", str(tmp_path / "hf"), "--quiet",
                 "--format", "hf"]) == 0
    out = capsys.readouterr().out
    assert "npas model type" in out and "val_loss" not in out.split("converted")[0]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "npas"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert sum(k.startswith("npas.blocks.") for k in keys) == 7  # one tied block: each shared tensor once
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    model, tok, _ = load_trained(tmp_path / "npas")
    x = ids(1, 12)
    with torch.no_grad():
        assert (hf(x).logits - model(x)[0]).abs().max().item() <= 1e-5
    prompt = "ROMEO:"
    want = sample(model, tok, prompt, tokens=10, temperature=0, seed=0)
    torch.manual_seed(0)
    gen = hf.generate(torch.tensor([tok.encode(prompt)]), max_new_tokens=10, do_sample=False)
    assert tok.decode(gen[0, len(tok.encode(prompt)):].tolist()) == want


def test_unroll_writes_a_stock_llama_with_equal_logits(tmp_path):
    src = tmp_path / "src"
    make_llama(src, tied=False)
    cfg = tied_lora(read_hf_dir(src).cfg)
    d = cfg.to_dict()
    d["mlp_widths"] = [64, 48, 32]  # narrower MLPs are zero-padded to the widest
    d["block_of_layer"] = [0, 1, 1]
    cfg = ArchConfig.from_dict(d)
    res = convert_hf_dir(src, cfg, tmp_path / "un", fmt="hf", unroll=True)
    assert res.written["kind"] == "llama"
    config = json.loads((tmp_path / "un" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    stock = LlamaForCausalLM.from_pretrained(tmp_path / "un").eval()
    x = ids()
    with torch.no_grad():
        assert (stock(x).logits - res.conversion.model(x)[0]).abs().max().item() <= 1e-5


def test_a_plain_dense_llama_is_written_as_a_stock_llama(tmp_path):
    src = tmp_path / "src"
    hf = make_llama(src, tied=True, rope=LLAMA3)
    res = convert_hf_dir(src, None, tmp_path / "out", fmt="hf")
    assert res.written["kind"] == "llama"
    back = LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    x = ids()
    with torch.no_grad():
        assert (back(x).logits - hf(x).logits).abs().max().item() <= 1e-5


def test_tokenizer_json_gives_a_loss_pass_equal_for_the_identity(tmp_path, tokenizer):
    src = tmp_path / "src"
    make_llama(src, tokenizer)
    res = convert_hf_dir(src, None, tmp_path / "out")
    assert res.note is None
    assert abs(res.val_loss - res.source_val_loss) <= 1e-4
    assert (tmp_path / "out" / "tokenizer.json").read_text() == tokenizer.to_json()
    model, tok, cfg = load_trained(tmp_path / "out")  # an npas model directory: sample, train DIR read it
    assert tok.fingerprint == tokenizer.fingerprint and cfg.chassis.family == "llama"


def refused(capsys, argv, out):
    capsys.readouterr()  # save_pretrained's progress bars
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())
    return err


def test_unsupported_architecture_bin_and_rope_type_are_refused_in_one_line(tmp_path, capsys):
    src = tmp_path / "src"
    make_llama(src)
    config = json.loads((src / "config.json").read_text())
    out = tmp_path / "out"

    (src / "config.json").write_text(json.dumps(config | {"architectures": ["GPT2LMHeadModel"]}))
    err = refused(capsys, ["convert", str(src), "--out", str(out)], out)
    assert "GPT2LMHeadModel" in err and "LlamaForCausalLM" in err

    (src / "config.json").write_text(json.dumps(config | {"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                                              "rope_theta": 1e4}}))
    err = refused(capsys, ["convert", str(src), "--out", str(out)], out)
    assert "yarn" in err and "llama3" in err

    (src / "config.json").write_text(json.dumps(config | {"attention_bias": True}))
    assert "attention_bias" in refused(capsys, ["convert", str(src), "--out", str(out)], out)

    (src / "config.json").write_text(json.dumps(config))
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    err = refused(capsys, ["convert", str(src), "--out", str(out)], out)
    assert "pytorch_model.bin" in err and "safetensors" in err and "arbitrary code" in err


def test_unroll_without_hf_and_kv_sharing_unrolled_are_refused(tmp_path, capsys):
    src = tmp_path / "src"
    make_llama(src)
    out = tmp_path / "out"
    assert "--format hf" in refused(capsys, ["convert", str(src), "--out", str(out), "--unroll"], out)
    d = read_hf_dir(src).cfg.to_dict()
    d["kv_source"] = [0, 0, 2]
    alloc = tmp_path / "kv.yaml"
    alloc.write_text(ArchConfig.from_dict(d).to_yaml())
    err = refused(capsys, ["convert", str(src), "--to", str(alloc), "--out", str(out), "--format", "hf",
                           "--unroll"], out)
    assert "keys/values" in err


def test_mistral_without_a_sliding_window_reads_like_llama(tmp_path, capsys):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64, sliding_window=None)
    hf = MistralForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "src")
    x = ids()
    with torch.no_grad():
        assert (read_hf_dir(tmp_path / "src").model(x)[0] - hf(x).logits).abs().max().item() <= 1e-4
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    (tmp_path / "src" / "config.json").write_text(json.dumps(config | {"sliding_window": 16}))
    out = tmp_path / "out"
    assert "sliding_window" in refused(capsys, ["convert", str(tmp_path / "src"), "--out", str(out)], out)


def test_config_fields_are_honoured_or_refused_without_weights():
    from npas.conversion.hf_source import hf_chassis
    from npas.errors import ConfigError

    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256}
    c = hf_chassis(base | {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 4}, "pretraining_tp": 2,
                           "head_dim": 32, "num_key_value_heads": 1, "rms_norm_eps": 1e-5}, "legacy")
    assert c.rope == {"rope_type": "linear", "factor": 4} and c.rope_theta == 5e5 and c.head_size == 32
    assert c.kv_heads == 1 and c.rms_norm_eps == 1e-5 and c.tie_embeddings is False  # LlamaConfig's default
    c3 = hf_chassis(base | {"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                                             "high_freq_factor": 4}}, "x")
    assert c3.rope["original_max_position_embeddings"] == 256  # transformers' fallback
    assert ArchConfig.from_yaml(npas_yaml(c3)).chassis == c3  # round-trips through config.yaml
    for bad, word in (({"hidden_act": "gelu"}, "hidden_act"), ({"mlp_bias": True}, "mlp_bias"),
                      ({"rope_scaling": {"rope_type": "dynamic", "factor": 2}}, "dynamic"),
                      ({"rope_scaling": {"rope_type": "linear"}}, "factor"), ({"architectures": []}, "none given")):
        with pytest.raises(ConfigError, match=word):
            hf_chassis(base | bad, "x")


def npas_yaml(chassis) -> str:
    from npas.allocation.config import reference_config

    return reference_config(chassis).to_yaml()


@pytest.mark.parametrize("kv_mode", ["none", "kv", "v"])
def test_generate_decodes_with_a_cache_holding_only_kv_source_layers(tmp_path, kv_mode):
    from transformers import DynamicCache

    src = tmp_path / "src"
    make_llama(src, tied=True)
    d = read_hf_dir(src).cfg.to_dict()
    d.update(block_of_layer=[0, 1, 0], lora_attn=[4, 4, 4])
    if kv_mode != "none":
        d.update(kv_source=[0, 0, 2], kv_mode=kv_mode)
    cfg = ArchConfig.from_dict(d)
    res = convert_hf_dir(src, cfg, tmp_path / "hf", fmt="hf")
    model = res.conversion.model.eval()
    x = ids(2, 9)
    cache = DynamicCache(config=AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config)
    with torch.no_grad():  # prefill 5, then one token, then three: the same logits as one full forward
        parts = [model(x[:, a:b], cache=cache)[0] for a, b in ((0, 5), (5, 6), (6, 9))]
        assert (torch.cat(parts, 1) - model(x)[0]).abs().max().item() <= 1e-5
    stored = [i for i, layer in enumerate(cache.layers) if getattr(layer, "keys", None) is not None
              and layer.keys.numel()]
    assert stored == ([0, 1, 2] if kv_mode != "kv" else [0, 2])  # a full KV consumer stores nothing
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    lengths = []
    hf.npas.wte.register_forward_hook(lambda _m, inp, _o: lengths.append(inp[0].shape[1]))
    with torch.no_grad():
        cached = hf.generate(x[:1, :5], max_new_tokens=6, do_sample=False)
        assert lengths == [5] + [1] * 5  # the prompt once, then one token per step
        assert torch.equal(cached, hf.generate(x[:1, :5], max_new_tokens=6, do_sample=False, use_cache=False))


def test_cli_dtype_sets_an_hf_sources_output_dtype_and_is_refused_for_an_npas_source(tmp_path, capsys):
    src = tmp_path / "src"
    make_llama(src)  # float32
    out = tmp_path / "bf16"
    assert main(["convert", str(src), "--out", str(out), "--dtype", "bfloat16", "--quiet"]) == 0
    model, _, cfg = _load_npas(out)
    assert cfg.dtype == "bfloat16" and next(model.parameters()).dtype == torch.bfloat16
    err = refused(capsys, ["convert", str(out), "--to", str(out / "config.yaml"), "--out", str(tmp_path / "again"),
                           "--dtype", "float16"], tmp_path / "again")
    assert "--dtype applies to a Hugging Face source" in err
