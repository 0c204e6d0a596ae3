"""T5 and BART encoder–decoders, saved with ``save_pretrained`` and loaded from the directory:
the two stacks' site names, the residual identities per stack (with the decoder's
cross-attention sublayer), attention identities, interventions and capture."""

import tempfile

import pytest
import torch

from _models import TEXTS
from structlens.capture.capture import collect
from structlens.interventions import hooked
from structlens.models import load_model
from structlens.models.tiny import VOCAB, byte_tokenizer
from structlens.sites import SiteError

_COMMON = dict(
    vocab_size=VOCAB,
    pad_token_id=VOCAB - 1,
    eos_token_id=VOCAB - 1,
    decoder_start_token_id=VOCAB - 1,
)
CONFIGS = {
    "t5": (
        "T5Config",
        dict(_COMMON, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
             num_heads=4, dropout_rate=0.0, relative_attention_num_buckets=8),
    ),
    "bart": (
        "BartConfig",
        dict(_COMMON, bos_token_id=VOCAB - 1, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, max_position_embeddings=64, dropout=0.0,
             attention_dropout=0.0, activation_dropout=0.0),
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(CONFIGS))
def seq2seq(request):
    import transformers

    cls, kwargs = CONFIGS[request.param]
    torch.manual_seed(0)
    hf = transformers.AutoModelForSeq2SeqLM.from_config(getattr(transformers, cls)(**kwargs))
    with torch.no_grad():  # random norm gains (1-D parameters), so "before the gain" matters
        for p in hf.parameters():
            p.normal_(0.0, 0.08) if p.dim() > 1 else p.normal_(1.0, 0.3)
    hf.config.architectures = [type(hf).__name__]
    hf.config.n_positions = 64  # read by TransformerLens for T5
    d = tempfile.mkdtemp(prefix="structlens-model-")
    hf.save_pretrained(d)
    byte_tokenizer().save_pretrained(d)
    return request.param, load_model(d)


def _run(model, texts=TEXTS):
    ids, mask = model.tokenize(texts)
    with hooked(model, model.site_names()) as c:
        out = model.hf(
            input_ids=ids,
            attention_mask=mask,
            decoder_input_ids=model.hf.prepare_decoder_input_ids_from_labels(labels=ids),
            output_hidden_states=True,
        )
    return ids, mask, c, out


def _close(a, b, tol=1e-5):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6)) < tol


def test_the_two_stacks_are_named_separately(seq2seq):
    name, model = seq2seq
    names = set(model.site_names())
    for stack in ("encoder", "decoder"):
        for site in ("attn.hook_pattern", "attn.hook_q", "attn.hook_z", "mlp.hook_post"):
            assert f"{stack}.0.{site}" in names, (stack, site)
    assert "decoder.1.hook_cross_attn_out" in names and "decoder.1.hook_resid_mid_cross" in names
    for site in ("q", "k", "v", "attn_scores", "pattern", "z"):
        assert f"decoder.0.cross_attn.hook_{site}" in names
    assert "encoder.0.hook_cross_attn_out" not in names
    assert "encoder.0.cross_attn.hook_pattern" not in names
    assert not any(n.startswith("blocks.") for n in names)
    with pytest.raises(SiteError, match="named encoder"):
        model.site("blocks.0.hook_resid_pre")
    assert model.site("decoder.-1.hook_resid_post").name == "decoder.1.hook_resid_post"


def test_residual_identities_per_stack(seq2seq):
    name, model = seq2seq
    ids, mask, c, out = _run(model)
    for stack, hidden in (
        ("encoder", out.encoder_hidden_states),
        ("decoder", out.decoder_hidden_states),
    ):
        for layer in range(2):
            g = lambda k, layer=layer, stack=stack: c[f"{stack}.{layer}.hook_{k}"]  # noqa: E731
            assert _close(hidden[layer], g("resid_pre"), 1e-6), (stack, layer)
            assert _close(g("resid_pre") + g("attn_out"), g("resid_mid")), (stack, layer)
            mid = g("resid_mid")
            if stack == "decoder":
                assert _close(mid + g("cross_attn_out"), g("resid_mid_cross")), layer
                mid = g("resid_mid_cross")
            assert _close(mid + g("mlp_out"), g("resid_post")), (stack, layer)
        assert _close(c[f"{stack}.0.hook_resid_post"], c[f"{stack}.1.hook_resid_pre"], 1e-6)


def test_attention_and_projection_identities(seq2seq):
    name, model = seq2seq
    ids, mask, c, _ = _run(model)
    n = ids.shape[1]
    for stack in ("encoder", "decoder"):
        for layer in range(2):
            site = lambda k, layer=layer, stack=stack: c[f"{stack}.{layer}.attn.hook_{k}"]  # noqa: E731
            pattern, scores = site("pattern"), site("attn_scores")
            assert pattern.shape == (len(TEXTS), model.n_heads, n, n)
            assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)
            assert _close(torch.softmax(scores, -1), pattern, 1e-4)
            if stack == "decoder":  # causal self-attention
                assert torch.all(pattern.triu(1) == 0)
            else:  # the encoder attends to every unpadded key, and to no padded one
                assert torch.equal(pattern[:, 0, 0] > 0, mask.bool())
            assert _close(torch.einsum("bhqk,bkhd->bqhd", pattern, site("v")), site("z"), 1e-4)
            if name == "t5":  # pre-LN: attn_out = z W_O, mlp_out = post W_out
                g = lambda k, layer=layer, stack=stack: c[f"{stack}.{layer}.{k}"]  # noqa: E731
                blk = model.layer_module(
                    model.global_layer(model.site(f"{stack}.{layer}.attn.hook_z"))
                )
                ff = blk.layer[-1].DenseReluDense
                assert _close(
                    blk.layer[0].SelfAttention.o(site("z").flatten(-2)), g("hook_attn_out")
                )
                assert _close(ff.wo(g("mlp.hook_post")), g("hook_mlp_out"))


def test_cross_attention_identities(seq2seq):
    name, model = seq2seq
    ids, mask, c, _ = _run(model)
    for layer in range(2):
        site = lambda k, layer=layer: c[f"decoder.{layer}.cross_attn.hook_{k}"]  # noqa: E731
        pattern, scores = site("pattern"), site("attn_scores")
        assert pattern.shape == (len(TEXTS), model.n_heads, ids.shape[1], ids.shape[1])
        assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)
        assert _close(torch.softmax(scores, -1), pattern, 1e-4)
        # every decoder position reads every unpadded encoder position, and no padded one
        assert torch.equal(pattern > 0, mask.bool()[:, None, None, :].expand_as(pattern))
        raw = torch.einsum("bqhd,bkhd->bhqk", site("q"), site("k"))
        raw = raw * model.layer_module(2 + layer, model.family.decoder.cross_attn).scaling
        fin = torch.isfinite(scores)
        assert _close(raw[fin], scores[fin], 1e-4)  # no position bias in cross-attention
        assert _close(torch.einsum("bhqk,bkhd->bqhd", pattern, site("v")), site("z"), 1e-4)
        if name == "t5":  # cross_attn_out = z W_O
            o = model.layer_module(2 + layer, "layer.1.EncDecAttention.o")
            assert _close(o(site("z").flatten(-2)), c[f"decoder.{layer}.hook_cross_attn_out"])


def test_reads_and_identity_writes_leave_the_output(seq2seq):
    name, model = seq2seq
    ids, mask = model.tokenize(TEXTS)
    ref = model.forward(ids, mask)
    names = model.site_names()
    with hooked(model, names):
        read = model.forward(ids, mask)
    with hooked(model, writes={s: (lambda a: a * 1.0) for s in names if s != "unembed.hook_out"}):
        written = model.forward(ids, mask)
    assert _close(read, ref) and _close(written, ref, 1e-4)
    # zeroing the decoder's last cross-attention changes the output; the identities still hold
    site = "decoder.1.hook_cross_attn_out"
    with hooked(model, ["decoder.1.hook_resid_mid", "decoder.1.hook_resid_mid_cross"],
                {site: torch.zeros_like}) as c:  # fmt: skip
        ablated = model.forward(ids, mask)
    assert not _close(ablated, ref, 1e-3)
    assert _close(c["decoder.1.hook_resid_mid_cross"], c["decoder.1.hook_resid_mid"])


def test_capture_reads_both_stacks(seq2seq):
    name, model = seq2seq
    sites = ["encoder.1.hook_resid_post", "decoder.0.mlp.hook_post", "decoder.1.attn.hook_z"]
    prompts = model.tokenizer(TEXTS[:2])["input_ids"]
    got = collect(model, prompts, sites)
    n_tokens = sum(len(t) for t in prompts)
    assert got["encoder.1.hook_resid_post"].shape == (n_tokens, model.d_model)
    assert got["decoder.0.mlp.hook_post"].shape == (n_tokens, model.d_mlp)
    assert got["decoder.1.attn.hook_z"].shape == (n_tokens, model.n_heads, model.d_head)
    # the rows are the same tokens' activations as in a plain hooked pass
    ids, mask = model.tokenize(TEXTS[:2])
    with hooked(model, ["encoder.1.hook_resid_post"]) as c:
        model.forward(ids, mask)
    ref = c["encoder.1.hook_resid_post"][mask.bool()]
    assert torch.allclose(got["encoder.1.hook_resid_post"], ref, atol=1e-5)


def test_sites_command_lists_both_stacks(seq2seq, tmp_path):
    import json

    from typer.testing import CliRunner

    from structlens.cli.main import app

    name, model = seq2seq
    r = CliRunner().invoke(app, ["sites", model.source, "--out", str(tmp_path), "-q"])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "sites.json").read_text())["sites"]
    listed = {row["site"]: row["shape"] for row in rows}
    assert list(listed) == model.site_names()
    assert listed["encoder.0.attn.hook_pattern"] == [model.n_heads, "query_pos", "key_pos"]
    assert listed["decoder.0.attn.hook_q"] == [model.n_heads, model.d_head]
    assert listed["decoder.0.mlp.hook_post"] == [model.d_mlp]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_t5_sites_equal_transformer_lens(seq2seq):
    pytest.importorskip("transformer_lens", reason="transformer-lens is not installed")
    name, model = seq2seq
    if name != "t5":
        pytest.skip("TransformerLens's HookedEncoderDecoder supports T5 only")
    from transformer_lens import HookedEncoderDecoder
    from transformer_lens import loading_from_pretrained as loading

    cfg = loading.get_pretrained_model_config(model.source, device="cpu")
    tl = HookedEncoderDecoder(cfg, tokenizer=model.tokenizer, move_to_device=False)
    tl.load_state_dict(loading.get_pretrained_state_dict(model.source, cfg, model.hf), strict=False)
    ids, mask = model.tokenize(["The quick brown fox jumps over the lazy dog."])
    decoder_ids = model.hf.prepare_decoder_input_ids_from_labels(labels=ids)
    _, theirs = tl.run_with_cache(ids, decoder_input=decoder_ids)
    with hooked(model, model.site_names()) as ours:
        model.forward(ids, mask)
    sites = [s for s in model.site_names() if s != "logits"]  # compared as unembed.hook_out
    for site in sites:
        a, b = ours[site], theirs[site]
        assert a.shape == b.shape, site
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin), site
        assert float((a - b).abs()[fin].max() / b[fin].abs().max()) < 1e-4, site
    assert {"decoder.1.attn.hook_attn_scores", "decoder.1.hook_resid_mid_cross"} <= set(sites)


def test_site_gradients_are_the_first_order_effect_of_a_write(seq2seq):
    from structlens.interventions import site_grads

    name, model = seq2seq
    ids, mask = model.tokenize(TEXTS[:2])
    sites = ["encoder.1.hook_attn_out", "decoder.0.hook_cross_attn_out", "decoder.1.mlp.hook_post"]
    with hooked(model, sites, grad=True) as c:
        base = model.forward(ids, mask)[..., 5].sum()
    grads = site_grads(base, c)
    gen = torch.Generator().manual_seed(0)
    eps = 1e-3
    for site in sites:
        direction = torch.randn(c[site].shape, generator=gen)
        moved = []
        for sign in (1, -1):  # a central difference: no second-order term
            with hooked(model, writes={site: lambda a, d=direction * sign * eps: a + d}):
                moved.append(float(model.forward(ids, mask)[..., 5].sum()))
        effect = (moved[0] - moved[1]) / 2
        predicted = float((grads[site] * direction).sum()) * eps
        assert abs(effect - predicted) < 1e-2 * abs(predicted) + 1e-5, (site, effect, predicted)
