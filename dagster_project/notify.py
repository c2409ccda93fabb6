"""Where alerts go: a local alert log (the default), or a Slack-compatible webhook that also keeps that log of what it
delivered. Chosen by type hint."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dagster as dg


@dataclass(frozen=True)
class Alert:
    kind: str  # "check" | "run"
    title: str  # one line: what failed, where
    asset: str = ""
    partition: str = ""
    check: str = ""
    description: str = ""
    run_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    run_url: str = ""  # the run in the Dagster UI
    check_url: str = ""  # the check's page in the Dagster UI ("" for a run alert)

    def text(self) -> str:
        lines = [f":rotating_light: {self.title}"]
        if self.description:
            lines.append(self.description)
        lines += [f"- {k}: {v}" for k, v in self.metadata.items()]
        if self.run_id:
            lines.append(f"run {self.run_id}: {self.run_url}" if self.run_url else f"run {self.run_id}")
        if self.check_url:
            lines.append(f"check: {self.check_url}")
        return "\n".join(lines)


class Notifier(dg.ConfigurableResource):
    """Base: sends one alert; raises on failure so the sensor retries it on its next tick."""

    def send(self, alert: Alert) -> None:
        raise NotImplementedError


class AlertLogNotifier(Notifier):
    """Appends each alert as one JSON line to a local file (the default)."""

    path: str

    def send(self, alert: Alert) -> None:
        append_line(self.path, alert)


def append_line(path: str, alert: Alert) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(alert), sort_keys=True) + "\n")


class WebhookNotifier(Notifier):
    """Posts `{"text": ...}` (Slack's incoming-webhook format) to a URL given through an env var."""

    url: str  # set with dg.EnvVar("HIR_ALERT_WEBHOOK_URL"): never a literal
    timeout_s: float = 10.0
    attempts: int = 3
    log_path: str = ""  # also append each delivered alert here (the local record of what went out); "": no log

    def send(self, alert: Alert) -> None:
        body = json.dumps({"text": alert.text(), "hir_alert": asdict(alert)}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        for attempt in range(1, self.attempts + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    if response.status < 300:
                        if self.log_path:
                            append_line(self.log_path, alert)
                        return
            except (urllib.error.URLError, TimeoutError) as exc:
                if attempt == self.attempts:
                    raise RuntimeError(f"alert webhook failed after {attempt} attempts: {exc}") from exc
            time.sleep(0.5 * 2 ** (attempt - 1))
