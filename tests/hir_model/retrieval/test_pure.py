"""The embed, hierarchy and retrieval libraries never import Dagster (or the asset layer)."""

import subprocess
import sys


def test_never_imports_dagster():
    code = ("import sys\nimport hir_model.embed, hir_model.embed.entity_embeddings, hir_model.hierarchy, "
            "hir_model.hierarchy.interest_hierarchy, hir_model.retrieval, "
            "hir_model.retrieval.load_index, hir_model.cli\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'hir_assets', 'dagster_project'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
