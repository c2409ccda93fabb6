"""Training stage: `hir_encoder`, the window's checkpoint, trained by the one entry point, launched through Dagster Pipes
(or, with launch="in_process", called in the step's own process)."""


import base64
import io
import json
import shutil
import sys
from pathlib import Path

from typing import Optional

import dagster as dg
import numpy as np

from hir_assets.publication import BlockingChecksFailed, Gate, STEP_RETRY, partitioned, publishes
from hir_assets.resources import PartitionStorage
from hir_model.content import CONTENT_ASSET, CONTENT_FILE
from hir_model.data.tables import EVENTS_ASSET, EVENTS_FILE
from hir_model.graph.window import GRAPH_ASSET
from hir_model.storage import PartitionStore, latest_before
from hir_model.train.checkpoint import CHECKPOINT_FILE, ENCODER_ASSET

GROUP = "training"
METRICS_FILE = "metrics.json"
LOSS_CHECK, COLLAPSE_CHECK, REPRODUCE_CHECK = "loss_finite_and_decreased", "no_level_collapsed", "checkpoint_reproduces_probe"
WARM_LOSS_TOLERANCE = 0.02  # a warm-started window's held-out loss may end at most 2% above where it started
MIN_USAGE_ENTROPY = 0.2  # normalised prototype-usage entropy per level below this = collapsed
PROBE_TOLERANCE = 1e-4  # max |embedding difference| when the checkpoint re-embeds the probe batch
PREVIOUS = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)
CHECK_SPECS = [
    dg.AssetCheckSpec(LOSS_CHECK, asset=ENCODER_ASSET, blocking=True, description="every step's loss is finite, and the loss on fixed held-out batches fell over the window's training "
                                 f"(a warm-started window: did not rise by more than {WARM_LOSS_TOLERANCE:.0%})"),
    dg.AssetCheckSpec(COLLAPSE_CHECK, asset=ENCODER_ASSET, blocking=True,
                      description=f"every level's prototype-usage entropy (normalised) is above {MIN_USAGE_ENTROPY}"),
    dg.AssetCheckSpec(REPRODUCE_CHECK, asset=ENCODER_ASSET, blocking=True,
                      description="the checkpoint loads (weights_only) and reproduces the logged probe-batch embeddings"),
]


class HirEncoderRun(dg.Config):
    """How the entry point is launched, and TrainConfig fields over hir.toml's [train] (None: hir.toml's, else
    TrainConfig's; hir_model.train.entry applies them)."""

    launch: str = "pipes"  # "pipes": the entry point in its own process through Dagster Pipes, as on a cluster;
    # "in_process": the same entry point in the step's process, without a process start (the demo's choice, see LAUNCHES)
    nproc_per_node: int = 1  # > 1: launch with torchrun (DDP: gloo on CPU, nccl on GPU); needs launch="pipes"
    steps: Optional[int] = None  # optimizer steps of the window
    threads: Optional[int] = None  # torch threads per process (None: torch's default)
    levels: Optional[str] = None  # prototypes per level, coarse to fine, e.g. "4,12,36"


LAUNCHES = ("pipes", "in_process")  # in_process skips starting Python, torch and the entry's imports: about 3 s of a
# MovieLens window's 10 s on 2 cores; Pipes keeps training in its own process (memory, a crash, a GPU run launcher)


def previous_checkpoint(store: PartitionStore, key: str) -> str | None:
    """The latest partition before `key` holding a checkpoint (what window `key` warm-starts from)."""
    return latest_before(store, ENCODER_ASSET, key, CHECKPOINT_FILE)


def command(args: list[str], nproc: int) -> list[str]:
    """The entry point, under torchrun when nproc > 1, else a plain python process."""
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m",
                "dagster_project.train_entry", *args]
    return [sys.executable, "-m", "dagster_project.train_entry", *args]


def loss_plot(losses: list[float], parts: dict[str, list[float]]) -> str:
    """Markdown with the loss curves as an inline base64 PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3), dpi=80)
    ax.plot(losses, label="total")
    for name, values in parts.items():
        ax.plot(values, label=name, alpha=0.7)
    ax.set_xlabel("step"), ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.tight_layout(), fig.savefig(buf, format="png"), plt.close(fig)
    return f"![loss](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})"


def reproduces_probe(checkpoint: Path, graph_dir: Path, events: Path | None, content: Path | None, metrics: dict) -> float:
    """Max |difference| between the logged probe embeddings and the reloaded checkpoint's."""
    import torch

    from hir_model.train.checkpoint import load_checkpoint, load_trained_model
    from hir_model.train.config import TrainConfig
    from hir_model.train.data import load_train_data
    from hir_model.train.trainer import embed_nodes

    model = load_trained_model(checkpoint)
    cfg = TrainConfig.from_dict(load_checkpoint(checkpoint)["extra"]["train_config"])
    data = load_train_data(graph_dir, events, content)
    again = embed_nodes(model.encoder, model.global_tokens, data, np.array(metrics["probe_nodes"], np.int64), cfg)
    return float((again - torch.tensor(metrics["probe_embeddings"])).abs().max()) if len(again) else 0.0


def check_results(metrics: dict, probe_error: float) -> list[dg.AssetCheckResult]:
    losses, entropy = metrics["losses"], metrics["usage_entropy"]
    finite = bool(losses) and bool(np.isfinite(losses).all())
    first, last = metrics.get("held_out_start", float("nan")), metrics.get("held_out_final", float("nan"))
    measured = "held-out batches before / after the window's steps"
    if not (np.isfinite(first) and np.isfinite(last)):  # no held-out batches configured: the first / last steps' means
        k = max(1, min(3, len(losses) // 4))
        first, last = (float(np.mean(losses[:k])), float(np.mean(losses[-k:]))) if losses else (-1.0, -1.0)
        measured = f"mean of the first / last {k} training steps"
    # A fresh model must improve. A warm-started one may already sit at its plateau (MovieLens from ~window 25: held-out
    # 5.89 -> 5.93, step losses wandering 5.7-6.2), so there it must not get worse by more than the noise allowance.
    allowed = first * (1 + WARM_LOSS_TOLERANCE) if metrics.get("warm_started") else first
    passed = finite and (last < first or (bool(metrics.get("warm_started")) and last <= allowed))
    return [
        dg.AssetCheckResult(check_name=LOSS_CHECK, passed=passed,
                            metadata={"start_loss": dg.MetadataValue.float(float(first)), "final_loss": dg.MetadataValue.float(float(last)),
                                      "allowed_final": dg.MetadataValue.float(float(allowed)),
                                      "loss_change": dg.MetadataValue.float(float(last - first)),
                                      "nonfinite_steps": dg.MetadataValue.int(int((~np.isfinite(losses)).sum()) if losses else 0),
                                      "warm_started": bool(metrics.get("warm_started")), "measured_on": measured}),
        dg.AssetCheckResult(check_name=COLLAPSE_CHECK, passed=bool(entropy) and min(entropy) > MIN_USAGE_ENTROPY,
                            metadata={"usage_entropy": dg.MetadataValue.json(entropy), "threshold": dg.MetadataValue.float(MIN_USAGE_ENTROPY),
                                      "min_entropy": dg.MetadataValue.float(float(min(entropy)) if entropy else float("nan")),
                                      **{f"entropy_L{i}": dg.MetadataValue.float(float(e)) for i, e in enumerate(entropy)}}),
        dg.AssetCheckResult(check_name=REPRODUCE_CHECK, passed=probe_error <= PROBE_TOLERANCE,
                            metadata={"max_abs_error": dg.MetadataValue.float(float(probe_error)),
                                      "tolerance": dg.MetadataValue.float(PROBE_TOLERANCE)}),
    ]


def window_inputs(store: PartitionStore, key: str) -> tuple[Path, Path, Path | None]:
    """hir_encoder's inputs of window `key`: the graph folder, the events file, the content file (None: not published)."""
    content = store.partition_dir(CONTENT_ASSET, key) / f"{CONTENT_FILE}.parquet"
    return (store.partition_dir(GRAPH_ASSET, key), store.partition_dir(EVENTS_ASSET, key) / f"{EVENTS_FILE}.parquet",
            content if content.is_file() else None)


def entry_args(store: PartitionStore, key: str, out: Path, previous: str | None, overrides: dict,
               config: HirEncoderRun) -> list[str]:
    """The training entry point's arguments (hir_model.train.entry) for window `key`: its inputs, warm-started from
    window `previous`'s checkpoint, hir.toml's [train] `overrides`, then the run config's fields."""
    graph_dir, events, content = window_inputs(store, key)
    args = ["--graph", str(graph_dir), "--out", str(out), "--window", key, "--events", str(events)]
    args += ["--content", str(content)] if content is not None else []
    args += ["--init", str(store.partition_dir(ENCODER_ASSET, previous) / CHECKPOINT_FILE)] if previous else []
    args += ["--overrides", json.dumps(overrides)] if overrides else []
    args += ["--steps", str(config.steps)] if config.steps else []
    args += ["--threads", str(config.threads)] if config.threads else []
    args += ["--levels", config.levels] if config.levels else []
    return args


def check_launch(config: HirEncoderRun) -> None:
    """Refuse a run config that names no launch, or more than one process without Pipes (before anything runs)."""
    if config.launch not in LAUNCHES or (config.launch == "in_process" and config.nproc_per_node > 1):
        raise dg.Failure(description=f"hir_encoder: launch={config.launch!r} with nproc_per_node={config.nproc_per_node}: "
                                     f"launch is one of {LAUNCHES}, and more than one process needs launch='pipes'",
                         allow_retries=False)


def train_in_process(context: dg.AssetExecutionContext, args: list[str], config: HirEncoderRun) -> dict:
    """The training entry point called in this process (launch="in_process"); its scalar metrics as metadata."""
    from hir_model.train import entry

    parsed = entry.parse(args)
    context.log.info(f"training {parsed.window} in process")
    metrics = entry.run(parsed)
    context.log.info(f"trained {parsed.window}: final loss {metrics['final_loss']}")
    return entry.scalar_metrics(metrics)


def commit_checkpoint(store: PartitionStore, key: str, out: Path, metrics: dict, gate=None) -> None:
    """Publish the trained checkpoint `out` and its metrics as window `key`'s hir_encoder (`gate(metrics)` judges them
    before the commit)."""
    with store.writing() as staging:
        folder = staging.path(ENCODER_ASSET, key)
        shutil.copyfile(out, folder / CHECKPOINT_FILE)
        (folder / METRICS_FILE).write_text(json.dumps(metrics) + "\n")
        if gate:
            gate(metrics)


def build_training_assets(partitions: dg.PartitionsDefinition, train_overrides: dict | None = None) -> list[dg.AssetsDefinition]:
    """`train_overrides`: TrainConfig fields from hir.toml's [train] (and [train.<source>]); the run config's
    steps / levels win over them."""
    overrides = dict(train_overrides or {})

    @dg.asset(name=ENCODER_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"pytorch"}, check_specs=partitioned(CHECK_SPECS, partitions),
              deps=[dg.AssetDep(GRAPH_ASSET), dg.AssetDep(CONTENT_ASSET), dg.AssetDep(EVENTS_ASSET),
                    dg.AssetDep(ENCODER_ASSET, partition_mapping=PREVIOUS)],
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY, pool="gpu")
    @publishes
    def hir_encoder(context: dg.AssetExecutionContext, config: HirEncoderRun, storage: PartitionStorage,
                    pipes_subprocess_client: dg.PipesSubprocessClient) -> dg.MaterializeResult:
        """Encoder + multi-level prototypes trained on data up to the window end, warm-started from t-1 (through Dagster Pipes unless launch="in_process")."""
        check_launch(config)
        key, store = context.partition_key, storage.store()
        graph_dir, events, content = window_inputs(store, key)
        previous = previous_checkpoint(store, key)
        scratch = store.root / ENCODER_ASSET / f".running-{key}"  # survives a killed run: the next one resumes from it
        scratch.mkdir(parents=True, exist_ok=True)
        out = scratch / CHECKPOINT_FILE
        args = entry_args(store, key, out, previous, overrides, config)
        if config.launch == "in_process":
            reported = train_in_process(context, args, config)
        else:
            reported = dict(pipes_subprocess_client.run(command=command(args, config.nproc_per_node), context=context)
                            .get_materialize_result().metadata or {})
        metrics = json.loads(Path(f"{out}.metrics.json").read_text())
        probe_error = reproduces_probe(out, graph_dir, events, content, metrics)
        gate = Gate(context, lambda m: check_results(m, probe_error))
        try:
            commit_checkpoint(store, key, out, metrics, gate)
        except BlockingChecksFailed:
            shutil.rmtree(scratch, ignore_errors=True)  # a checkpoint that failed its checks is never resumed from
            raise
        shutil.rmtree(scratch, ignore_errors=True)
        metadata = reported
        metadata.update({
            "loss_curve": dg.MetadataValue.md(loss_plot(metrics["losses"], metrics["parts"])),
            "usage_entropy": dg.MetadataValue.json(metrics["usage_entropy"]),
            "usage_share": dg.MetadataValue.json(metrics["usage_share"]),
            "steps": metrics["window_steps"], "total_steps": metrics["step"],
            "samples_per_s": round(metrics["samples_per_s"], 1), "attention_backend": metrics["backend"],
            "warm_started_from": previous or "none (first window)", "nproc_per_node": config.nproc_per_node, "launch": config.launch,
            "version": metrics["version"], "path": dg.MetadataValue.path(store.uri(ENCODER_ASSET, key)),
        })
        return dg.MaterializeResult(metadata=metadata, check_results=gate.results)

    return [hir_encoder]
