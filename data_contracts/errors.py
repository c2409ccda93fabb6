"""The one error a contract raises for a whole file or layout (imported by contract.py and options.py alike)."""

from __future__ import annotations


class ContractError(ValueError):
    """A whole input file (or a window's layout) breaks a contract: missing columns, uncastable values,
    undeclared timestamp encodings, an unreadable file, a misnamed or stray folder, a dangling link.

    The message names the file, the rule, the number of rows affected and, where there are rows, a sample.
    """

    def __init__(self, origin: str, rule: str, rows: int, detail: str):
        self.origin, self.rule, self.rows, self.detail = origin, rule, rows, detail
        super().__init__(f"{origin}: rule '{rule}' broken ({rows} rows): {detail}")
