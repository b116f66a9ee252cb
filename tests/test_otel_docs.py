"""The generated blocks of the telemetry and incident pages, and the README's span
tree, are what the code produces now (regenerate with
``python -m statemachine.dev._telemetry_docs``)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from statemachine.dev import _vendor
from statemachine.dev._telemetry_docs import documents, fill, span_tree_block, write_documents

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.requirement("ER-134")
def test_the_generated_pages_have_not_drifted() -> None:
    """The marked blocks of docs/telemetry.md and docs/incident.md, and
    docs/incident.dot, match the code, and docs/incident.svg records the digest of
    that .dot."""
    if shutil.which("dot") is None:
        pytest.fail("graphviz's dot is needed to check docs/incident.svg")
    drifted = write_documents(ROOT, check=True)
    assert not drifted, f"regenerate with `python -m statemachine.dev._telemetry_docs`: {drifted}"


@pytest.mark.requirement("ER-134")
def test_the_pages_show_a_real_run_and_a_drawn_incident() -> None:
    """The telemetry page holds a real run's span tree (session, turn, chat spans,
    waits, a fallback); the incident page the drawing and its steps."""
    files = documents()
    telemetry = files["docs/telemetry.md"]
    assert span_tree_block() in telemetry
    for needle in (
        "invoke_workflow turnstate  [",
        "invoke_agent turnstate",
        "chat primary",
        "turnstate.fallback",
        "http.response.status_code=529",
    ):
        assert needle in telemetry
    incident = files["docs/incident.md"]
    assert "![the incident drawn on the machine](incident.svg)" in incident
    assert "![the incident as a timeline](incident-timeline.svg)" in incident
    assert files["docs/incident-timeline.svg"].startswith("<svg")
    assert "retries_exhausted" in files["docs/incident-timeline.svg"]
    assert "13: ModelFailed [transient] / Finish(retries_exhausted)" in incident


@pytest.mark.requirement("ER-134")
def test_the_readme_span_tree_block_has_not_drifted() -> None:
    """README.md's marked block (<!-- otel-span-tree --> ... <!-- /otel-span-tree -->),
    once it has one, is the span tree the code produces."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    if "<!-- otel-span-tree -->" not in readme:
        pytest.skip("README.md has no otel-span-tree block yet")
    assert fill(readme, {"otel-span-tree": span_tree_block()}) == readme, (
        "the README's span tree drifted: paste span_tree_block() from "
        "statemachine/dev/_telemetry_docs.py (or docs/telemetry.md's block)"
    )


# -- the page's exporter set-ups, run for real ----------------------------------------

PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
MODEL = "claude-sonnet-4-5"
EXPORTED = {
    "invoke_workflow turnstate",
    "invoke_agent turnstate",
    f"chat {MODEL}",
    "execute_tool get_weather",
}
"""The spans of the page's turn: the session, the turn, its model call and its tool call."""


def _page_block(needle: str) -> str:
    """The one Python block of docs/telemetry.md that holds ``needle``."""
    text = (ROOT / "docs" / "telemetry.md").read_text(encoding="utf-8")
    (code,) = [code for code in PYTHON_BLOCK.findall(text) if needle in code]
    return code


def _run_with_the_turn(setup: str, vendor_url: str, **env: str) -> str:
    """The page's ``setup`` block then its turn, as one script in a fresh interpreter
    (the set-ups make the process's global providers), against the loopback vendor
    at ``vendor_url``; its standard output."""
    script = setup + "\n" + _page_block("sm.run_turn(")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ANTHROPIC_"))}
    clean.update(ANTHROPIC_BASE_URL=vendor_url, ANTHROPIC_API_KEY="loopback", **env)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def vendor() -> Iterator[_vendor.LoopbackVendor]:
    """The loopback vendor, answering the turn's one call with a get_weather call."""
    reply = _vendor.anthropic_message(
        "Let me look that up.", tool_uses=(("toolu_01", "get_weather", {"city": "Paris"}),)
    )
    with _vendor.LoopbackVendor() as served:
        served.script(_vendor.ANTHROPIC, reply)
        yield served


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects written one after the other in ``text`` (the console exporter's
    output: one indented object per span)."""
    decoder = json.JSONDecoder()
    found, at = [], 0
    while (at := text.find("{", at)) != -1:
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.requirement("ER-252", "ER-251")
def test_the_pages_console_set_up_prints_the_turns_spans(vendor: _vendor.LoopbackVendor) -> None:
    """docs/telemetry.md's console set-up, then its turn, run as a script: standard
    output holds one JSON span per span of the turn, in one trace, the chat span named
    with the model given to the provider, the tool call its own span. What else it
    prints (the SDK client's own spans, as the page says) is in traces of its own."""
    out = _run_with_the_turn(_page_block("ConsoleSpanExporter"), vendor.url)
    printed = _json_objects(out)
    (trace_id,) = {span["context"]["trace_id"] for span in printed if span["name"] in EXPORTED}
    ours = [span for span in printed if span["context"]["trace_id"] == trace_id]
    assert sorted(span["name"] for span in ours) == sorted(EXPORTED)
    spans = {span["name"]: span for span in ours}
    chat = spans[f"chat {MODEL}"]
    assert chat["kind"] == "SpanKind.CLIENT"
    assert chat["attributes"]["gen_ai.request.model"] == MODEL
    assert chat["attributes"]["gen_ai.response.model"] == "claude-test"
    assert chat["attributes"]["gen_ai.conversation.id"] == "chat-42"
    assert [seen.body["model"] for seen in vendor.requests(_vendor.ANTHROPIC)] == [MODEL]


class _Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1: every POST kept (path, content type, body),
    answered 200 with an empty export response."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, bytes]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                owner.posts.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> _Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def bodies(self, path: str) -> list[bytes]:
        """The bodies POSTed to ``path``, each sent as protobuf."""
        found = [(kind, body) for at, kind, body in self.posts if at == path]
        assert all(kind == "application/x-protobuf" for kind, _ in found), found
        return [body for _, body in found]


def _attribute(attributes: Any, key: str) -> Any:
    """A decoded OTLP attribute's value (``None``: absent)."""
    for attribute in attributes:
        if attribute.key == key:
            return getattr(attribute.value, attribute.value.WhichOneof("value"))
    return None


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.requirement("ER-252", "ER-251")
def test_the_pages_otlp_set_up_exports_the_turn(vendor: _vendor.LoopbackVendor) -> None:
    """docs/telemetry.md's OTLP set-up, then its turn, run as a script whose collector
    (OTEL_EXPORTER_OTLP_ENDPOINT) is a receiver in this process: the turn's spans reach
    /v1/traces and its metrics /v1/metrics, as protobuf, with the set-up's service name
    and the chat span's GenAI attributes. The script flushes on its own (its shutdown,
    the SDK's at exit): nothing here waits."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    with _Receiver() as receiver:
        out = _run_with_the_turn(
            _page_block("OTLPSpanExporter"), vendor.url, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url
        )
    assert out == ""
    spans: dict[str, Any] = {}
    others: list[Any] = []  # the SDK client's own spans, as the page says
    services = set()
    for body in receiver.bodies("/v1/traces"):
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services.add(_attribute(resource_spans.resource.attributes, "service.name"))
            for scope_spans in resource_spans.scope_spans:
                if scope_spans.scope.name == "turnstate":
                    spans.update({span.name: span for span in scope_spans.spans})
                else:
                    others.extend(scope_spans.spans)
    assert set(spans) == EXPORTED
    assert len({span.trace_id for span in spans.values()}) == 1
    assert not {span.trace_id for span in others} & {span.trace_id for span in spans.values()}
    assert services == {"weather-agent"}
    chat = spans[f"chat {MODEL}"].attributes
    assert _attribute(chat, "gen_ai.request.model") == MODEL
    assert _attribute(chat, "gen_ai.provider.name") == "anthropic"
    assert _attribute(chat, "gen_ai.usage.input_tokens") == 10
    metrics = set()
    for body in receiver.bodies("/v1/metrics"):
        request = ExportMetricsServiceRequest.FromString(body)
        metrics.update(
            metric.name
            for resource_metrics in request.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        )
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage"} <= metrics
    assert "turnstate.turns" in metrics


@pytest.mark.requirement("ER-252")
def test_the_pages_not_run_blocks_are_the_ones_run_here() -> None:
    """The page's blocks marked not-run for tests/test_docs.py (they set the process's
    global providers and need a vendor) are, in order, the two set-ups and the turn
    the two tests above run."""
    page = (ROOT / "docs" / "telemetry.md").read_text(encoding="utf-8")
    not_run = re.findall(r"<!-- not-run -->\n```python\n(.*?)```", page, re.DOTALL)
    run_here = ("ConsoleSpanExporter", "OTLPSpanExporter", "sm.run_turn(")
    assert not_run == [_page_block(needle) for needle in run_here]


@pytest.mark.requirement("ER-134")
def test_a_page_that_lost_a_blocks_marker_is_refused() -> None:
    """A generated block whose markers are gone (or one of them) is an error, never a
    page left as it was."""
    page = (ROOT / "docs" / "telemetry.md").read_text(encoding="utf-8")
    for marker in ("<!-- token-buckets -->", "<!-- /token-buckets -->"):
        with pytest.raises(ValueError, match="no marked block token-buckets"):
            fill(page.replace(marker, ""), {"token-buckets": "1, 4"})
