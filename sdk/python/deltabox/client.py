"""The client of a DeltaBox daemon: pools, leases, sandboxes and snapshots."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional
from urllib.parse import quote

from ._transport import DEFAULT_ADDRESS, Progress, Transport, stream
from .sandbox import Sandbox


class Client:
    """A connection to the daemon's API socket.

    ``address`` is the socket (``/path`` or ``unix:///path``), or ``tcp://host:port`` (TLS, with
    a bearer token: ``token``, else ``DELTABOX_TOKEN``, else the first line of ``token_file`` /
    ``DELTABOX_TOKEN_FILE``; the daemon's certificate must chain to ``ca_file`` /
    ``DELTABOX_CA_FILE``, else to the system's roots); by default ``DELTABOX_ADDRESS`` or
    /run/deltabox/deltabox.sock. ``timeout`` (seconds) bounds each socket operation; None
    waits as long as the daemon takes. Answers are the API's JSON objects as dicts, with the
    API's field names unchanged (docs/api/openapi.yaml).
    """

    def __init__(self, address: Optional[str] = None, timeout: Optional[float] = None, *,
                 token: Optional[str] = None, token_file: Optional[str] = None, ca_file: Optional[str] = None,
                 cert_file: Optional[str] = None, key_file: Optional[str] = None) -> None:
        self.transport = Transport(address or os.environ.get("DELTABOX_ADDRESS") or DEFAULT_ADDRESS, timeout,
                                   token=token, token_file=token_file, ca_file=ca_file, cert_file=cert_file,
                                   key_file=key_file)

    @property
    def address(self) -> str:
        """The socket this client dials."""
        return self.transport.address

    def close(self) -> None:
        """Close the calling thread's kept-alive connection."""
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the node

    def info(self) -> Dict[str, Any]:
        """The daemon, its dependencies and the host (GET /v1/info)."""
        return self.transport.json("GET", "/v1/info")

    # --- pools

    def create_pool(self, name: str, image: str, min_ready: int = 0, max: int = 0, **template: Any) -> Dict[str, Any]:
        """Create a pool; ``template`` takes the other Template fields (cpus, memory_bytes,
        pids, disk_bytes, env, workdir, labels, egress_policy)."""
        body = dict(template, name=name, image=image, min_ready=min_ready, max=max)
        return self.transport.json("POST", "/v1/pools", body)

    def pools(self) -> List[Dict[str, Any]]:
        return self.transport.json("GET", "/v1/pools")

    def pool(self, name: str) -> Dict[str, Any]:
        return self.transport.json("GET", "/v1/pools/" + quote(name, safe=""))

    def remove_pool(self, name: str, force: bool = False) -> None:
        """Remove a pool; with force its leased sandboxes are destroyed too."""
        self.transport.json("DELETE", "/v1/pools/" + quote(name, safe=""), query={"force": force})

    def scale_pool(self, name: str, min_ready: int) -> Dict[str, Any]:
        return self.transport.json("POST", f"/v1/pools/{quote(name, safe='')}/scale", {"min_ready": min_ready})

    def lease(self, pool: str, env: Optional[List[str]] = None, labels: Optional[Dict[str, str]] = None,
              egress_policy: Optional[str] = None) -> Sandbox:
        """Lease a sandbox from ``pool``. Use it as a context manager to release it at the end::

            with client.lease("py") as sb:
                sb.exec(["python3", "-c", "print(1)"])
        """
        body: Dict[str, Any] = {}
        if env:
            body["env"] = list(env)
        if labels:
            body["labels"] = dict(labels)
        if egress_policy:
            body["egress_policy"] = egress_policy
        info = self.transport.json("POST", f"/v1/pools/{quote(pool, safe='')}/lease", body)
        return Sandbox(self.transport, info["sandbox"], info)

    # --- sandboxes

    def sandboxes(self) -> List[Dict[str, Any]]:
        """The leased sandboxes, then the quarantined ones."""
        return self.transport.json("GET", "/v1/sandboxes")

    def sandbox(self, id: str) -> Sandbox:
        """A handle on a leased sandbox (its info fetched now)."""
        info = self.transport.json("GET", "/v1/sandboxes/" + quote(id, safe=""))
        return Sandbox(self.transport, id, info)

    def adopt(self, id: str, pool: Optional[str] = None) -> Sandbox:
        """Make a quarantined sandbox leased again."""
        info = self.transport.json("POST", f"/v1/sandboxes/{quote(id, safe='')}/adopt", {"pool": pool} if pool else {})
        return Sandbox(self.transport, id, info)

    def destroy(self, id: str) -> None:
        """Destroy a quarantined sandbox."""
        self.transport.json("POST", f"/v1/sandboxes/{quote(id, safe='')}/destroy", {})

    # --- snapshots

    def snapshots(self, store: Optional[str] = None) -> List[Dict[str, Any]]:
        return self.transport.json("GET", "/v1/snapshots", query={"store": store})

    def remove_snapshot(self, uri: str) -> None:
        self.transport.json("DELETE", "/v1/snapshots", query={"uri": uri})

    def restore(self, uri: str, pool: Optional[str] = None, on_progress: Optional[Progress] = None) -> Sandbox:
        """Restore a snapshot (``STORE#NAME`` or ``NAME``) into a new leased sandbox."""
        body: Dict[str, Any] = {"uri": uri}
        if pool:
            body["pool"] = pool
        final = stream(self.transport, "/v1/restore", body, on_progress)
        lease = final["leases"][0]
        return Sandbox(self.transport, lease["sandbox"], lease)

