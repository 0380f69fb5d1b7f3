"""The levels of an exchange of tables sharded over ranks (rec_sdk.distribute.ranks): direct, or
two levels with per-host dedup (REC_SDK_RANKS_PER_HOST)."""

import os

from rec_sdk.base.log import logger
from rec_sdk.distribute.cluster import CollectiveGroup


class Route:
    """One level of an exchange: its collective group (None: every training task; else a
    rec_sdk.distribute.cluster.CollectiveGroup), its size, this rank's index in it, and where each
    key goes in it (`owner`: the owning rank -> an index in the group). `last`: the level
    whose destinations own the keys."""

    def __init__(self, group, size, index, owner, last):
        self.group, self.size, self.index, self.owner, self.last = (group, size, index, owner, last)


# Ranks per host for per-host dedup: "auto" (hosts from the cluster's addresses), a number
# (consecutive ranks), or unset / 0 / 1: none.
RANKS_PER_HOST_ENV = "REC_SDK_RANKS_PER_HOST"


def ranks_per_host(devices, addresses=None):
    """The ranks per host that per-host dedup groups (REC_SDK_RANKS_PER_HOST), or 0 for none:
    it needs at least two hosts of at least two ranks each, every host the same number of
    consecutive ranks."""
    value = os.environ.get(RANKS_PER_HOST_ENV, "").strip().lower()
    ranks = len(devices)
    if value in ("", "0", "1"):
        return 0
    if value == "auto":
        hosts = [address.rsplit(":", 1)[0] for address in addresses or []]
        if len(hosts) != ranks:
            return 0
        per_host = hosts.count(hosts[0])
        consecutive = all(hosts[r] == hosts[r - r % per_host] for r in range(ranks))
        if not consecutive or ranks % per_host or len(set(hosts)) != ranks // per_host:
            logger.warning(
                "rec_sdk: %s=auto: the training tasks are not the same number of "
                "consecutive tasks per host (%s): no per-host dedup",
                RANKS_PER_HOST_ENV,
                ", ".join(hosts),
            )
            return 0
    else:
        try:
            per_host = int(value)
        except ValueError:
            per_host = -1
        if per_host < 0 or per_host and ranks % per_host:
            raise ValueError(
                "%s must be auto, 0 or a divisor of the rank count (%d), got %r"
                % (RANKS_PER_HOST_ENV, ranks, value)
            )
    return per_host if 1 < per_host < ranks else 0


def routes(rank, devices, addresses=None):
    """The levels of an exchange over `devices` (the ranks'). Direct: each rank sends each
    owner its keys. Per-host dedup (ranks_per_host L > 0, H hosts): rank (h, l) = h * L + l
    first sends each key to the rank of its host whose place l' is the owner's place on its
    host (a group per host), which deduplicates the host's keys; that rank sends them to the
    owner (a group per place: the ranks l' of every host). Rows come back the same way,
    gradients are summed at each level."""
    size = len(devices)
    per_host = ranks_per_host(devices, addresses)
    if not per_host:
        return [Route(None, size, rank, lambda owners: owners, True)]
    hosts = size // per_host
    host, place = divmod(rank, per_host)
    on_host = CollectiveGroup(
        2 + host, devices[host * per_host : (host + 1) * per_host], host, hosts
    )
    across = CollectiveGroup(2 + hosts + place, devices[place::per_host], place, per_host)
    return [
        Route(on_host, per_host, place, lambda owners: owners % per_host, False),
        Route(across, hosts, host, lambda owners: owners // per_host, True),
    ]
