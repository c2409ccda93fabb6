"""The training entry point as Dagster launches it: hir_model's entry point, reporting through Dagster Pipes.

    python -m dagster_project.train_entry --graph G --events E --out ckpt.pt ...
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m dagster_project.train_entry ...

Locally the `hir_encoder` asset starts it with PipesSubprocessClient; on a cluster the same module runs under the
Pipes clients for ECS or Kubernetes. Only rank 0 opens the Pipes channel; other ranks just train. Launched
without a Pipes client, it behaves like `python -m hir_model.train.entry`.
"""

from __future__ import annotations

import os

import dagster_pipes

from hir_model.train import entry


def main(argv: list[str] | None = None) -> None:
    args = entry.parse(argv)
    launched = os.environ.get(dagster_pipes.DAGSTER_PIPES_CONTEXT_ENV_VAR) and os.environ.get(dagster_pipes.DAGSTER_PIPES_MESSAGES_ENV_VAR)
    if int(os.environ.get("RANK", "0")) != 0 or not launched:
        entry.main(argv)
        return
    with dagster_pipes.open_dagster_pipes() as context:
        context.log.info(f"training {args.window} (world size {os.environ.get('WORLD_SIZE', '1')})")
        metrics = entry.run(args)
        context.log.info(f"trained {args.window}: final loss {metrics['final_loss']}")
        context.report_asset_materialization(
            metadata=entry.scalar_metrics(metrics) | {"usage_entropy": {"raw_value": metrics["usage_entropy"], "type": "json"}})


if __name__ == "__main__":
    main()
