"""Generated Apache Common Log Format input for the log app (tests, benchmarks), with its answer.

    64.242.88.10 - - [07/Mar/2004:16:05:49 -0800] "GET /twiki/bin/view/Main/WebHome HTTP/1.1" 200 4523

Many days of a small 2004-era site like the sample logs: popular hosts and paths come back often
(Zipf-like), traffic follows the clock (busier in the afternoon, quieter at weekends), timestamps
never go back within a day, the zone is -0800. Status mix: mostly 200, some 304/302/401/404, rare
500 and 408 (whose request is "-"); methods GET, POST, HEAD, OPTIONS ("OPTIONS * HTTP/1.0"); size
"-" for 304, 408 and OPTIONS, 0 for HEAD.

Deterministic for a seed. Each day draws from its own random generator, its statuses first, so
`expected_counts` can give the daily (day, status) counts without formatting a single line.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

START_DAY = "2004-03-07"  # the first day of the sample logs
ZONE = "-0800"
MARKER = b"END_OF_DAY"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

STATUS_WEIGHTS = {200: 79.0, 304: 9.0, 302: 2.5, 401: 5.0, 404: 3.9, 500: 0.5, 408: 0.1}
METHOD_WEIGHTS = {"GET": 95.0, "POST": 3.0, "HEAD": 1.5, "OPTIONS": 0.5}
PROTOCOL_WEIGHTS = {"HTTP/1.1": 88.0, "HTTP/1.0": 12.0}
# Requests per hour of the (Pacific) day, midnight first.
HOUR_WEIGHTS = (3, 2, 2, 1, 1, 2, 3, 5, 7, 9, 10, 10, 9, 10, 11, 11, 10, 9, 8, 7, 6, 6, 5, 4)
WEEKEND_TRAFFIC = 0.7  # share of a weekday's volume on Saturday and Sunday (with daily variation)

_STATUSES = tuple(STATUS_WEIGHTS)
_STATUS_CUM = tuple(accumulate(STATUS_WEIGHTS.values()))
_METHODS = tuple(METHOD_WEIGHTS)
_METHOD_CUM = tuple(accumulate(METHOD_WEIGHTS.values()))
_PROTOCOLS = tuple(PROTOCOL_WEIGHTS)
_PROTOCOL_CUM = tuple(accumulate(PROTOCOL_WEIGHTS.values()))
_HOURS = tuple(range(24))
_HOUR_CUM = tuple(accumulate(HOUR_WEIGHTS))
_HMS: tuple[str, ...] = ()  # "HH:MM:SS" of every second of a day, built on first use

_WEBS = ("Main", "TWiki", "Sandbox", "Know", "Support")
_TOPICS = (
    "WebHome", "WebChanges", "WebIndex", "WebSearch", "WebNotify", "WebPreferences", "WebStatistics",
    "TWikiUsers", "TWikiGroups", "WikiSyntax", "TextFormattingRules", "NewUserTemplate", "SpamAssassin",
    "SpamAssassinDeleting", "DCCAndPostFix", "ConfigurationVariables", "PostfixCommands", "RBLsHowTo",
    "MailmanAdmin", "TWikiRegistration", "GoodStyle", "FileAttachment", "TWikiDocumentation",
    "WebTopicList", "TWikiPlugins", "AppendixFileSystem", "TWikiVariables", "SiteMap", "ChangePassword",
)
_LISTS = ("hsdivision", "webct", "ppwc", "cnc_notice", "gisgrad", "techcomm", "faculty", "mgt")
_STATIC = (
    "/", "/robots.txt", "/favicon.ico", "/razor.html", "/dccstats/index.html", "/dccstats/stats-spam.1day.png",
    "/twiki/pub/TWiki/TWikiLogos/twikiRobot46x50.gif", "/twiki/pub/TWiki/TWikiLogos/twikiRobot121x54.gif",
    "/mailman/mailman.jpg", "/icons/PythonPowered.png", "/icons/mailman.jpg", "/mailman",
    "/_vti_bin/owssvr.dll?UL=1&ACT=4&BUILD=2614&STRMVER=4&CAPREQ=0", "/MSOffice/cltreq.asp?UL=1&ACT=4",
)
_DOMAINS = ("ca.shawcable.net", "dclient.hispeed.ch", "nyc.rr.com", "tc.ph.cox.net", "dialup.ziplink.net",
            "vic.bigpond.net.au", "telia.com", "inktomisearch.com", "googlebot.com", "acn.waw.pl")
_USERS = ("admin", "bob", "alice", "jsmith", "mailman")


def _hms() -> tuple[str, ...]:
    global _HMS
    if not _HMS:
        _HMS = tuple(f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}" for s in range(86400))
    return _HMS


def _zipf_cum(n: int, exponent: float = 1.1) -> list[float]:
    """Cumulative weights that make the first items of a pool the popular ones."""
    return list(accumulate(1.0 / (i + 1) ** exponent for i in range(n)))


@dataclass(frozen=True)
class _Site:
    """The hosts and resources of the site: the same for every day of a seed."""

    hosts: list[str]
    host_cum: list[float]
    paths: list[str]
    path_cum: list[float]
    path_size: dict[str, int]


def _site(seed: int) -> _Site:
    rng = random.Random(f"eventide-log-site:{seed}")
    hosts = {"64.242.88.10", "10.0.0.153"}  # the sample's heavy hitters: a crawler and a local user
    while len(hosts) < 3000:
        a, b, c, d = (rng.randrange(1, 255) for _ in range(4))
        if rng.random() < 0.45:
            hosts.add(f"{a}.{b}.{c}.{d}")
        else:
            hosts.add(f"{rng.choice(('h', 'ip', 'cpe-', 'host'))}{a}-{b}-{c}-{d}.{rng.choice(_DOMAINS)}")
    host_list = sorted(hosts)
    rng.shuffle(host_list)
    paths = set(_STATIC)
    while len(paths) < 800:
        web, topic = rng.choice(_WEBS), rng.choice(_TOPICS)
        kind = rng.random()
        if kind < 0.55:
            paths.add(f"/twiki/bin/view/{web}/{topic}")
        elif kind < 0.7:
            r = rng.randrange(2, 40)
            paths.add(f"/twiki/bin/rdiff/{web}/{topic}?rev1=1.{r}&rev2=1.{r - 1}")
        elif kind < 0.8:
            paths.add(f"/twiki/bin/edit/{web}/{topic}?topicparent={web}.{rng.choice(_TOPICS)}")
        elif kind < 0.9:
            paths.add(f"/mailman/listinfo/{rng.choice(_LISTS)}")
        else:
            paths.add(f"/twiki/bin/oops/{web}/{topic}?template=oopsmore&param1=1.{rng.randrange(2, 40)}")
    path_list = sorted(paths)
    rng.shuffle(path_list)
    path_size = {p: int(rng.lognormvariate(8.6, 0.9)) + 40 for p in path_list}
    return _Site(host_list, _zipf_cum(len(host_list)), path_list, _zipf_cum(len(path_list)), path_size)


def _day_rng(seed: int, day_index: int) -> random.Random:
    return random.Random(f"eventide-log-day:{seed}:{day_index}")


def day_line_counts(lines: int, days: int, seed: int = 1, start: str = START_DAY,
                    daily_variation: float = 0.3) -> list[int]:
    """Lines per day, summing to `lines`: weekends quieter and each day +-`daily_variation` at
    random (0: the same count every day, give or take one). Every day has a line if lines >= days."""
    if days <= 0 or lines < 0:
        raise ValueError(f"need days > 0 and lines >= 0, got days={days}, lines={lines}")
    first = dt.date.fromisoformat(start)
    rng = random.Random(f"eventide-log-volume:{seed}")
    weights = []
    for i in range(days):
        w = 1.0 + daily_variation * rng.uniform(-1.0, 1.0)
        if daily_variation and (first + dt.timedelta(days=i)).weekday() >= 5:
            w *= WEEKEND_TRAFFIC
        weights.append(w)
    floor = 1 if lines >= days else 0
    spare = lines - floor * days
    total = sum(weights)
    exact = [spare * w / total for w in weights]
    counts = [int(x) for x in exact]
    # Largest remainders take the lines rounding left over, so the total is exact.
    for i in sorted(range(days), key=lambda i: exact[i] - counts[i], reverse=True)[: spare - sum(counts)]:
        counts[i] += 1
    return [c + floor for c in counts]


@dataclass(frozen=True)
class LogDay:
    day: dt.date
    lines: list[str]  # each ends with its line ending (LF or CRLF)
    status_counts: Counter  # status -> lines of the day with it


def _draw_statuses(rng: random.Random, n: int) -> list[int]:
    return rng.choices(_STATUSES, cum_weights=_STATUS_CUM, k=n)  # always a day's first draw


def _day_lines(site: _Site, rng: random.Random, day: dt.date, statuses: list[int], eol: str) -> list[str]:
    n = len(statuses)
    hms = _hms()
    hours = rng.choices(_HOURS, cum_weights=_HOUR_CUM, k=n)
    seconds = sorted(h * 3600 + rng.randrange(3600) for h in hours)  # never back in time within a day
    hosts = rng.choices(site.hosts, cum_weights=site.host_cum, k=n)
    paths = rng.choices(site.paths, cum_weights=site.path_cum, k=n)
    methods = rng.choices(_METHODS, cum_weights=_METHOD_CUM, k=n)
    protocols = rng.choices(_PROTOCOLS, cum_weights=_PROTOCOL_CUM, k=n)
    noise = [rng.random() for _ in range(n)]
    stamp = f"{day.day:02d}/{_MONTHS[day.month - 1]}/{day.year}"
    path_size = site.path_size
    out = []
    for i in range(n):
        status, method, path, r = statuses[i], methods[i], paths[i], noise[i]
        user = _USERS[int(r * 1000) % len(_USERS)] if r < 0.01 and status == 200 else "-"
        if status == 408:  # the client never sent a request line
            request, size = "-", "-"
        else:
            if status == 304 or (method == "OPTIONS" and status != 200):
                method = "GET"  # conditional GETs; OPTIONS is answered, not refused
            if method == "OPTIONS":
                request, size = "OPTIONS * HTTP/1.0", "-"
            else:
                request = f"{method} {path} {protocols[i]}"
                if method == "HEAD":
                    size = 0
                elif status == 200:
                    base = path_size[path]
                    size = base + int(base * (r - 0.5) * 0.2) if path.startswith("/twiki/bin/") else base
                elif status == 304:
                    size = "-"
                elif status == 302:
                    size = 301
                elif status == 401:
                    size = 12846 if r < 0.9 else 12851
                elif status == 404:
                    size = 284 + int(r * 20)
                else:
                    size = 538 + int(r * 100)
        out.append(f'{hosts[i]} - {user} [{stamp}:{hms[seconds[i]]} {ZONE}] "{request}" {status} {size}{eol}')
    return out


def iter_log_days(lines: int, days: int, seed: int = 1, crlf: bool = False, start: str = START_DAY,
                  daily_variation: float = 0.3) -> Iterator[LogDay]:
    """The generated days in order, one in memory at a time."""
    site = _site(seed)
    first = dt.date.fromisoformat(start)
    eol = "\r\n" if crlf else "\n"
    for i, n in enumerate(day_line_counts(lines, days, seed, start, daily_variation)):
        day = first + dt.timedelta(days=i)
        rng = _day_rng(seed, i)
        statuses = _draw_statuses(rng, n)
        yield LogDay(day, _day_lines(site, rng, day, statuses, eol), Counter(statuses))


def expected_counts(lines: int, days: int, seed: int = 1, start: str = START_DAY,
                    daily_variation: float = 0.3) -> dict[tuple[dt.date, int], int]:
    """(day, status) -> lines, what the generator makes for these arguments (crlf and markers do not
    change it). Draws only the statuses, so it is much cheaper than generating."""
    first = dt.date.fromisoformat(start)
    out: dict[tuple[dt.date, int], int] = {}
    for i, n in enumerate(day_line_counts(lines, days, seed, start, daily_variation)):
        day = first + dt.timedelta(days=i)
        for status, count in Counter(_draw_statuses(_day_rng(seed, i), n)).items():
            out[(day, status)] = count
    return out


def iter_log_payloads(lines: int, days: int, seed: int = 1, crlf: bool = False, markers: bool = True,
                      start: str = START_DAY, daily_variation: float = 0.3, marker: bytes = MARKER,
                      expected: dict | None = None) -> Iterator[bytes]:
    """The messages a sender sends: each line with its line ending, then `marker` after each day
    (with `markers`). Given a dict as `expected`, adds each day's (day, status) counts to it."""
    for log_day in iter_log_days(lines, days, seed, crlf, start, daily_variation):
        for line in log_day.lines:
            yield line.encode()
        if expected is not None:
            for status, count in log_day.status_counts.items():
                expected[(log_day.day, status)] = expected.get((log_day.day, status), 0) + count
        if markers:
            yield marker


def generate_logs(out: str | Path, lines: int, days: int, seed: int = 1, crlf: bool = False,
                  markers: bool = True, start: str = START_DAY, daily_variation: float = 0.3) -> dict:
    """Write the logs. `out` ending in `.log` or `.txt`: one file with every day, and (with
    `markers`) an END_OF_DAY line after each day. Otherwise a folder with one file per day,
    `access-YYYY-MM-DD.log`, as a web server writes them: no markers inside
    (`eventide send ... --end-of-day` adds one after each file).

    Returns {"files", "lines", "bytes", "markers", "days", "expected"}; `expected` maps
    (day, status) to its count.
    """
    out = Path(out)
    single = out.suffix in (".log", ".txt")
    if single:
        out.parent.mkdir(parents=True, exist_ok=True)
    else:
        out.mkdir(parents=True, exist_ok=True)
    marker_line = MARKER + (b"\r\n" if crlf else b"\n")
    files: list[Path] = []
    expected: dict[tuple[dt.date, int], int] = {}
    total_lines = total_bytes = markers_written = 0
    day_list: list[dt.date] = []
    sink = open(out, "wb") if single else None
    try:
        for log_day in iter_log_days(lines, days, seed, crlf, start, daily_variation):
            data = "".join(log_day.lines).encode()
            if single:
                sink.write(data)
                if markers:
                    sink.write(marker_line)
                    data += marker_line
                    markers_written += 1
            else:
                path = out / f"access-{log_day.day.isoformat()}.log"
                path.write_bytes(data)
                files.append(path)
            total_lines += len(log_day.lines)
            total_bytes += len(data)
            day_list.append(log_day.day)
            for status, count in log_day.status_counts.items():
                expected[(log_day.day, status)] = count
    finally:
        if sink is not None:
            sink.close()
    return {
        "files": [out] if single else files,
        "lines": total_lines,
        "bytes": total_bytes,
        "markers": markers_written,
        "days": day_list,
        "expected": expected,
    }
