"""Reading ``ss -tinpH state STATE`` output."""

from __future__ import annotations


def ss_sockets(out: str, pid: int) -> list[tuple[str, str, str]]:
    """(local, peer, congestion algorithm) of ``pid``'s sockets in ``out``,
    the output of ``ss -tinpH state STATE``."""
    rows: list[tuple[str, str, str]] = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if f"pid={pid}," not in line:
            continue
        parts = line.split()
        # The state filter drops the State column: Recv-Q Send-Q Local Peer users.
        local, peer = parts[2], parts[3]
        info = lines[i + 1].split() if i + 1 < len(lines) else []
        rows.append((local, peer, info[0] if info else ""))
    return rows
