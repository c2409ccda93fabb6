"""Content-embedding throughput on this CPU: text (MiniLM) and images (catalog_clip's tower), batched vs one by one.

Texts are the synthetic catalogue's product texts (what content_embeddings encodes); images are its 32 px
product pictures, decoded in memory. The image tower's speed does not depend on its weights, so it runs
with catalog_clip's architecture at initialisation; the full run adds open_clip ViT-B-32 (random weights,
speed only) for what a pretrained tower would cost here.

    python benchmarks/enrichment.py            # 512 texts, 2048 images, + ViT-B-32, fp32 and bf16 text (minutes)
    python benchmarks/enrichment.py --quick    # 128 texts, 256 images (seconds)
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/enrichment.py --quick --text-dtypes float32,bfloat16
                                               # as a CPU without AVX512-BF16 / AMX runs them (what "auto" avoids)

Prints one `key=value` line per case, then `case=ratio` lines: batched over one-by-one entities/s, and bfloat16 over
float32 text where both ran; `case=dtype` says what HIR_TEXT_DTYPE=auto picks on this CPU.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded


def corpus(n_texts: int, n_images: int):
    """(texts, images) from the synthetic source's default world."""
    import tempfile
    from pathlib import Path

    import numpy as np

    from hir_model.content.entity_text import entity_texts
    from hir_model.data.synthetic import KINDS, SyntheticConfig, SyntheticSource
    from hir_model.data.synthetic_images import draw

    source = SyntheticSource(SyntheticConfig(), Path(tempfile.gettempdir()) / "hir-bench-unused")
    products = source._kind_rows(KINDS.index("product"), np.arange(min(n_texts, len(source.world.products.fs))))
    texts = entity_texts(products)
    h, cfg, fine = source.world.hierarchy, source.config, source.world.products.fine
    images = [draw(cfg.seed, i, cfg.image_size, (int(h.coarse_of(fine[i])), int(h.mid_of(fine[i])), int(fine[i])), cfg.branching)
              for i in range(n_images)]
    return texts, images


def rate(encode, items, batch: int | None, repeats: int = 3) -> float:
    """Entities per second of the production `encode(items, batch_size=...)` (batch None: one call per item), the best
    of `repeats` passes after a warm-up (the best pass is the one least disturbed by other processes on a busy machine)."""
    encode(items[:2], batch_size=2)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        if batch:
            encode(items, batch_size=batch)
        else:
            for item in items:
                encode([item], batch_size=1)
        best = min(best, time.perf_counter() - t0)
    return len(items) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="128 texts and 256 images, no ViT-B-32, fp32 only")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2; 1 is steadier on a busy machine)")
    parser.add_argument("--text-dtypes", default=None,
                        help="MiniLM dtypes to measure, comma-separated (default: float32 with --quick, else float32,bfloat16)")
    args = parser.parse_args()
    import torch

    from hir_model.content import CatalogClipConfig, ImageEncoder, TextEncoder, TextEncoderConfig
    from hir_model.content.catalog_clip import build_model, preprocess
    from hir_model.content.text import native_bf16, resolve_dtype

    torch.set_num_threads(args.threads)
    n_texts, n_images = (128, 256) if args.quick else (512, 2048)
    texts, images = corpus(n_texts, n_images)
    single_n = 32 if args.quick else 64  # one-by-one runs over a prefix (same per-item cost, less waiting)

    dtypes = args.text_dtypes.split(",") if args.text_dtypes else ["float32"] if args.quick else ["float32", "bfloat16"]
    print(f"case=dtype native_bf16={native_bf16()} auto={resolve_dtype('auto')}", flush=True)
    text_rate = {}
    for dtype in dtypes:
        encoder = TextEncoder(TextEncoderConfig(dtype=dtype))
        batched = rate(encoder.encode, texts, 64)  # (the texts are distinct: nothing is de-duplicated away)
        single = rate(encoder.encode, texts[:single_n], None)
        tokens = encoder.tokenizer(texts, truncation=True, max_length=128)["input_ids"]
        print(f"case=text model=all-MiniLM-L6-v2 dtype={dtype} threads={args.threads} n={len(texts)} "
              f"mean_tokens={sum(map(len, tokens)) / len(tokens):.0f} batch=64 entities_per_s={batched:.1f} "
              f"one_by_one_entities_per_s={single:.1f}", flush=True)
        print(f"case=ratio what=text dtype={dtype} batched_over_one_by_one={batched / single:.2f}", flush=True)
        text_rate[resolve_dtype(dtype)] = batched
    if len(text_rate) == 2:
        print(f"case=ratio what=text bfloat16_over_float32={text_rate['bfloat16'] / text_rate['float32']:.2f}", flush=True)

    towers = [("catalog_clip", build_model(CatalogClipConfig().model_config()), preprocess(CatalogClipConfig().image_size))]
    if not args.quick:
        import open_clip

        vit, _, transform = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
        towers.append(("ViT-B-32(random weights, speed only)", vit, transform))
    for name, model, transform in towers:
        encoder = ImageEncoder(model, transform, name, name)
        subset = images if name == "catalog_clip" else images[:128]
        batched = rate(encoder.encode, subset, 256 if name == "catalog_clip" else 32)
        single = rate(encoder.encode, subset[:single_n], None)
        print(f"case=image model={name} threads={args.threads} n={len(subset)} dim={encoder.dim} "
              f"entities_per_s={batched:.1f} one_by_one_entities_per_s={single:.1f}", flush=True)
        print(f"case=ratio what=image model={name} batched_over_one_by_one={batched / single:.2f}", flush=True)


if __name__ == "__main__":
    main()
