"""One retry policy for every sender: exponential backoff, capped, with full jitter, honouring
a server's ``Retry-After`` up to a bound.

The try after failed try ``n`` (1-based) waits a random time in ``[0, min(max_s, base_s *
2**(n-1))]`` ("full jitter": a fleet of agents that lost the same server does not come back
in step), or exactly that bound with ``jitter=False``; a ``Retry-After`` the server sent wins,
up to ``retry_after_max_s``, so a hostile or confused receiver cannot park a sender for a day.

Who uses it, and how:

* senders whose one try is one HTTP request and whose answer is all they need (the findings
  poster in :mod:`core.poster`: the agent's fast path and the analyze service; the webhook
  adapter) hand the policy to urllib3 as its own ``Retry`` (:meth:`Backoff.urllib3_retry`);
* senders whose try is more than a request ask :meth:`Backoff.delay` between tries: the sink
  (:mod:`core.store.sink`) releases its batch to the spool between tries and retries for as
  long as it runs; the job-side reporter is standard library only; the Kubernetes adapter
  retries evictions a PodDisruptionBudget refused, pod by pod.

This module imports only the standard library; urllib3 is imported when a ``Retry`` is made.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

#: answers worth another try: too many requests, and the server's own failures
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class _Uniform(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


@dataclass(frozen=True)
class Backoff:
    """How long to wait before each retry, and when to stop."""

    base_s: float = 0.5
    max_s: float = 30.0
    #: tries in all, the first included; 0: no limit (the sink, which spools instead of giving up)
    attempts: int = 0
    jitter: bool = True
    retry_after_max_s: float = 300.0

    def bound(self, failed: int) -> float:
        """The longest wait after failed try number ``failed`` (1-based)."""
        return min(self.max_s, self.base_s * 2.0 ** (failed - 1))

    def delay(
        self, failed: int, retry_after_s: float | None = None, rng: _Uniform = random
    ) -> float:
        """Seconds to wait after failed try number ``failed`` (1-based)."""
        if retry_after_s is not None:
            return max(0.0, min(retry_after_s, self.retry_after_max_s))
        bound = self.bound(failed)
        return rng.uniform(0, bound) if self.jitter else bound

    def exhausted(self, tries: int) -> bool:
        """Whether ``tries`` tries are all the policy allows."""
        return self.attempts > 0 and tries >= self.attempts

    def urllib3_retry(self, statuses: frozenset[int] = RETRY_STATUSES) -> Any:
        """This policy as a ``urllib3.util.Retry`` for a POST (every sender here re-sends only
        what is safe to repeat: findings carry a stable id, webhooks a stable finding id).

        urllib3 waits ``0``, then ``base_s * 2``, ``base_s * 4``, ... up to ``max_s``, plus a
        random ``[0, base_s]`` when ``jitter``; it honours ``Retry-After`` up to
        ``retry_after_max_s`` (``retry_after_max``: urllib3 >= 2.7, hence the pin) and returns
        the last answer instead of raising once the tries are spent."""
        from urllib3.util.retry import Retry

        retries = max(0, self.attempts - 1) if self.attempts else None
        return Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            other=0,
            redirect=0,
            allowed_methods=None,  # POST too
            status_forcelist=statuses,
            backoff_factor=self.base_s,
            backoff_max=self.max_s,
            backoff_jitter=self.base_s if self.jitter else 0.0,
            respect_retry_after_header=True,
            raise_on_status=False,
            raise_on_redirect=False,
            retry_after_max=int(self.retry_after_max_s),
        )


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
