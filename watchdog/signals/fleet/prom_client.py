"""A small, bounded client for Prometheus's instant-query API (``GET /api/v1/query``).

Bounded in time (one deadline for connect, send and the whole read) and in size (the body is read in
chunks and refused past ``max_bytes``), so a slow or huge answer costs at most one worker thread a
few seconds, never the daemon's cycle. Anything that is not a well-formed ``vector`` answer is a
:class:`PromError` naming what was wrong. Works against Prometheus and what speaks its query API
(Thanos Query, Mimir/Cortex, VictoriaMetrics).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import httpx

from gpu_triage.signals.fleet.remote import Sample

MAX_SERIES = 200_000
"""More series than this in one answer is refused (a selector that matched far too much)."""


class PromError(RuntimeError):
    """A query that did not give an answer (unreachable, timed out, too large, malformed, an error)."""


@dataclass(frozen=True, slots=True)
class QueryResult:
    samples: tuple[Sample, ...]
    seconds: float
    """Wall time of the query."""
    bytes: int


class PromClient:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 3.0,
        max_bytes: int = 32 << 20,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
            headers={"Accept": "application/json", "Accept-Encoding": "gzip"},
            follow_redirects=False,
            trust_env=False,
        )

    def close(self) -> None:
        self._client.close()

    def query(self, promql: str) -> QueryResult:
        """One instant query; a ``vector`` answer as samples. Raises :class:`PromError`."""
        t0 = time.monotonic()
        deadline = t0 + self.timeout_s
        try:
            with self._client.stream(
                "GET",
                f"{self.url}/api/v1/query",
                params={"query": promql, "timeout": f"{max(1, int(self.timeout_s * 1000))}ms"},
            ) as resp:
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_bytes(1 << 16):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise PromError(f"answer larger than {self.max_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise PromError(f"answer not complete within {self.timeout_s:g} s")
                    chunks.append(chunk)
                status = resp.status_code
        except httpx.TimeoutException:
            raise PromError(f"no answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise PromError(f"unreachable: {type(e).__name__}: {e}"[:300]) from None
        body = b"".join(chunks)
        samples = parse_vector(body, status)
        return QueryResult(samples, time.monotonic() - t0, size)


def parse_vector(body: bytes, status: int = 200) -> tuple[Sample, ...]:
    """Prometheus's JSON answer -> samples (a ``vector`` only). Raises :class:`PromError`."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # nested too deep is no answer either
        raise PromError(f"HTTP {status}: not JSON ({body[:80]!r})") from None
    if not isinstance(doc, dict):
        raise PromError(f"HTTP {status}: expected a JSON object")
    if doc.get("status") != "success":
        raise PromError(f"HTTP {status}: {doc.get('errorType', '')!s}: {str(doc.get('error', ''))[:200]}")
    data = doc.get("data")
    if (
        not isinstance(data, dict)
        or data.get("resultType") != "vector"
        or not isinstance(data.get("result"), list)
    ):
        raise PromError("expected data.resultType 'vector' with a result list")
    result = data["result"]
    if len(result) > MAX_SERIES:
        raise PromError(f"{len(result)} series, more than {MAX_SERIES}")
    out = []
    for i, item in enumerate(result):
        metric = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if (
            not isinstance(metric, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
            or not isinstance(value, list)
            or len(value) != 2
        ):
            raise PromError(f"result[{i}]: expected {{metric: {{...}}, value: [time, 'number']}}")
        try:
            ts, number = float(value[0]), float(value[1])
        except (TypeError, ValueError):
            raise PromError(f"result[{i}]: value {value!r} is not [time, number]") from None
        if not math.isfinite(ts):
            raise PromError(f"result[{i}]: time {value[0]!r} is not finite")
        out.append(Sample(metric, number, ts))
    return tuple(out)


__all__ = ["PromClient", "PromError", "QueryResult", "Sample", "parse_vector"]
