import subprocess
import sys

MODULES = [f"hir_model.eval.{m}" for m in ("agreement", "compare", "hir", "lift", "pages", "publish", "report", "run",
                                              "text_vectors", "window_evaluation")]
MODULES += [f"hir_model.protocol.{m}" for m in ("split", "metrics", "method", "stats")]
MODULES += [f"hir_model.baselines.{m}" for m in ("als", "content_knn", "lightgcn", "popularity", "registry", "sequence")]


def test_eval_never_imports_dagster():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'hir_assets', 'dagster_project'))\n"
            + "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
