"""Locust's ``MasterRunner`` behind the link's checks: the master's half of the authenticated worker link.

Locust's master decodes every frame and hands every message to its own handlers. ``GuardedMaster``
stands in front of that: frames are decoded here, so a frame that cannot be decoded, or that claims
another peer's id, is dropped and counted (``WorkerPool.drop``) instead of ending Locust's receive
loop; each message then asks ``WorkerPool.admit`` whether it may reach Locust — a peer still in its
handshake gets its ``client_ready`` answered but held back (so it never gets users), and a message
Locust's handler fails on is dropped too. Frames bigger than ``MAX_FRAME_BYTES`` are refused by
ZeroMQ itself. The rules of the link: ``oomload.run.worker_pool``'s module docstring.

Locust, gevent and ZeroMQ are imported only when the class is built (``guarded_master_class``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oomload.run.worker_pool import WorkerPool

MAX_FRAME_BYTES = 64 * 1024 * 1024  # ZeroMQ drops a peer that sends a bigger frame


def guarded_master_class() -> Any:
    """Locust's ``MasterRunner`` with the link's checks in front of its message handling (the module
    docstring): frames are decoded here, so one that cannot be is dropped and counted instead of
    ending Locust's receive loop, and ``WorkerPool.admit`` decides what reaches Locust."""
    import gevent
    import zmq.green as zmq
    from locust.exception import RPCError
    from locust.rpc import Message
    from locust.runners import MasterRunner

    class GuardedServer:
        """Locust's ``rpc.Server`` with a receive that never raises on a peer's bad frame."""

        def __init__(self, inner: Any, pool: WorkerPool) -> None:
            self.inner = inner
            self.pool = pool
            inner.socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def recv_from_client(self) -> tuple[str, Any]:
            while True:
                try:
                    frames = self.inner.socket.recv_multipart()
                except zmq.ZMQError as err:
                    raise RPCError("ZMQ network broken") from err
                try:
                    addr = frames[0].decode()
                    msg = Message.unserialize(frames[1])  # type: ignore[no-untyped-call]
                except Exception:
                    self.pool.drop(frames[0][:64].hex() if frames else "?", "malformed")
                    continue
                if len(frames) != 2 or not isinstance(msg.type, str) or msg.node_id != addr:
                    self.pool.drop(addr, "malformed" if len(frames) != 2 else "forged_sender")
                    continue
                return addr, msg

    class GuardedMaster(MasterRunner):
        def __init__(self, environment: Any, pool: WorkerPool, **kwargs: Any) -> None:
            super().__init__(environment, **kwargs)
            # before the first yield: Locust's receive loop has not run yet
            self.server = GuardedServer(self.server, pool)  # type: ignore[assignment]
            self.oomload_pool = pool

        def handle_message(self, client_id: str, msg: Any) -> None:
            pool = self.oomload_pool
            why = pool.admit(client_id, msg.type)
            if why == "hold":
                pool.hold(client_id, msg)  # answered, so that it can say hello; not a client yet
                ack = Message("ack", {"index": -1}, client_id)  # type: ignore[no-untyped-call]
                self.server.send_to_client(ack)
                return
            if why is not None:
                if why:
                    pool.drop(client_id, why)
                return
            self.admit_to_locust(client_id, msg)

        def admit_to_locust(self, client_id: str, msg: Any) -> None:
            try:
                super().handle_message(client_id, msg)
            except (gevent.GreenletExit, RPCError):
                raise
            except Exception:
                self.oomload_pool.drop(client_id, "malformed")

    return GuardedMaster
