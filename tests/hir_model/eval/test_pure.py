import subprocess
import sys

MODULES = ("agreement", "als", "baselines", "content_knn", "hir", "lift", "lightgcn", "method", "metrics", "popularity", "publish",
           "report", "run", "split", "text_vectors", "window")


def test_eval_never_imports_dagster():
    code = ("import sys\n" + "".join(f"import hir_model.eval.{m}\n" for m in MODULES)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'hir_assets', 'dagster_project'))\n"
            + "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
