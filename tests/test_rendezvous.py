"""The rendezvous against hostile or broken peers, over real loopback sockets: every phase ends by its
deadline whatever a peer sends or withholds, a declared length is capped before anything is allocated,
a stray connection to rank 0's port is ignored, and malformed launcher variables are refused in one line.
Rank 0 or a joining rank runs on a thread; the test plays the other side with raw sockets."""

import socket
import struct
import threading
import time
import tracemalloc

import pytest

from cudnnnet.train.distributed import replicas as distributed, rendezvous
from cudnnnet.train.distributed.launcher import free_port
from cudnnnet.errors import DistributedError, UsageError

DIGEST = b"d" * 32
UNIQUE_ID = bytes(range(128))


def _launch(rank, world_size, port):
    return rendezvous.Launch(rank, world_size, 0, "127.0.0.1", port, "torchrun")


def _hello(rank=1, world_size=2, magic=rendezvous.MAGIC):
    return rendezvous.HELLO.pack(magic, rank, world_size, DIGEST)


class Rank(threading.Thread):
    """One real rank meeting the others on a thread; ``outcome`` is its (unique id, peers) or its error."""

    def __init__(self, rank, world_size, port, timeout):
        super().__init__(daemon=True)
        self.launch, self.timeout, self.outcome = _launch(rank, world_size, port), timeout, None
        self.started = time.monotonic()
        self.start()

    def run(self):
        try:
            self.outcome = rendezvous.meet(self.launch, DIGEST, lambda: UNIQUE_ID, self.timeout)
        except DistributedError as error:
            self.outcome = error

    def finished(self, seconds=10.0):
        """The outcome, and the seconds from the start to it."""
        self.join(seconds)
        assert not self.is_alive(), f"rank {self.launch.rank} still waits after {seconds} s"
        if isinstance(self.outcome, tuple):
            for connection in self.outcome[1].values():
                connection.close()
        return self.outcome, time.monotonic() - self.started


def _connect(port, seconds=5.0):
    """A connection to rank 0's port, retried while rank 0 is not yet listening."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=seconds)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _drip(connection, data, interval=0.2):
    """Send ``data`` a byte every ``interval`` s on a thread, until it is sent or the connection fails."""
    def send():
        for byte in data:
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(interval)

    threading.Thread(target=send, daemon=True).start()


def _closed_by_the_other_side(connection, seconds):
    connection.settimeout(seconds)
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class FakeRank0:
    """A listening socket that answers a joining rank's hello with ``answer``, then with ``drip`` a byte
    at a time; the connection stays open until ``close``."""

    def __init__(self, answer: bytes, drip: bytes = b""):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.answer, self.dripped, self.connections = answer, drip, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        connection, _ = self.server.accept()
        self.connections.append(connection)
        connection.recv(rendezvous.HELLO.size)
        connection.sendall(self.answer)
        _drip(connection, self.dripped)

    def close(self):
        for connection in [*self.connections, self.server]:
            connection.close()


# ---- deadlines ------------------------------------------------------------------------------------
def test_a_slow_drip_peer_cannot_hold_rank_0_past_its_deadline():
    port = free_port()
    rank_0 = Rank(0, 2, port, timeout=1.5)
    peer = _connect(port)
    _drip(peer, _hello())  # a valid hello, a byte every 0.2 s: 9 s in all
    try:
        outcome, seconds = rank_0.finished()
    finally:
        peer.close()
    assert isinstance(outcome, DistributedError) and "ranks 1 did not reach" in str(outcome)
    assert seconds < 3.5


@pytest.mark.parametrize("answer, dripped", [(b"\x00", UNIQUE_ID), (b"\x01" + struct.pack("!I", 30), b"r" * 30)],
                         ids=["unique id", "refusal"])
def test_a_slow_drip_rank_0_cannot_hold_a_joining_rank_past_its_deadline(answer, dripped):
    fake = FakeRank0(answer, dripped)
    try:
        outcome, seconds = Rank(1, 2, fake.port, timeout=1.5).finished()
    finally:
        fake.close()
    assert isinstance(outcome, DistributedError) and "did not answer within 1.5 s" in str(outcome)
    assert seconds < 3.5


def test_a_huge_declared_refusal_is_refused_before_anything_is_allocated():
    fake = FakeRank0(b"\x01" + struct.pack("!I", 2**32 - 1) + b"x" * 65536)
    tracemalloc.start()
    try:
        with pytest.raises(DistributedError) as refused:
            rendezvous.meet(_launch(1, 2, fake.port), DIGEST, lambda: UNIQUE_ID, 2.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        fake.close()
    message = str(refused.value)
    assert "a refusal of 4294967295 bytes" in message and f"at most {rendezvous.MAX_REFUSAL_BYTES}" in message
    assert peak < 1 << 20


def test_rank_0_s_refusal_is_shown_with_its_control_characters_escaped():
    reason = "\x1b[2Jcleared"
    fake = FakeRank0(b"\x01" + struct.pack("!I", len(reason)) + reason.encode())
    try:
        with pytest.raises(DistributedError) as refused:
            rendezvous.meet(_launch(1, 2, fake.port), DIGEST, lambda: UNIQUE_ID, 2.0)
    finally:
        fake.close()
    assert "\x1b" not in str(refused.value) and "\\x1b[2Jcleared" in str(refused.value)


def test_an_answer_that_is_not_cudnnnet_s_is_refused_at_once():
    fake = FakeRank0(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    try:
        outcome, seconds = Rank(1, 2, fake.port, timeout=5.0).finished()
    finally:
        fake.close()
    assert isinstance(outcome, DistributedError) and "is not a cudnnnet rank 0" in str(outcome)
    assert seconds < 2.0


# ---- stray connections to rank 0's port ---------------------------------------------------------------
def _stray(port, behaviour):
    """A connection that is no cudnnnet rank: a web client, a port scanner, a health check."""
    connection = _connect(port)
    if behaviour == "http":
        connection.sendall(b"GET / HTTP/1.1\r\nHost: node0\r\n\r\n")
    elif behaviour == "zeros":
        connection.sendall(bytes(rendezvous.HELLO.size))
    elif behaviour == "part of a hello, then closes":
        connection.sendall(rendezvous.MAGIC[:3])
        connection.close()
    elif behaviour == "closes":
        connection.close()
    return connection


@pytest.mark.parametrize("behaviour", ["http", "zeros", "part of a hello, then closes", "closes", "silent"])
def test_a_stray_connection_is_ignored_and_the_ranks_still_join(behaviour, caplog):
    port = free_port()
    rank_0 = Rank(0, 3, port, timeout=5.0)
    stray = _stray(port, behaviour)
    time.sleep(0.2)  # the stray first: rank 0 is busy with it when the ranks come
    joining = [Rank(rank, 3, port, timeout=5.0) for rank in (1, 2)]
    outcomes = [rank.finished() for rank in (rank_0, *joining)]
    try:
        for outcome, seconds in outcomes:
            assert isinstance(outcome, tuple) and outcome[0] == UNIQUE_ID
            assert seconds < 3.0
        assert sorted(outcomes[0][0][1]) == [1, 2]
        if behaviour == "silent":  # rank 0 closed it once the ranks had joined
            assert _closed_by_the_other_side(stray, 2.0)
        else:
            assert "is not a cudnnnet rank; ignored" in caplog.text
    finally:
        stray.close()


def test_a_silent_stray_is_closed_after_the_greeting_time_while_rank_0_waits(monkeypatch):
    monkeypatch.setattr(rendezvous, "GREETING_SECONDS", 0.3)
    port = free_port()
    rank_0 = Rank(0, 2, port, timeout=5.0)
    stray = _connect(port)
    try:
        assert _closed_by_the_other_side(stray, 2.0)
        assert rank_0.is_alive()
        joined, _ = Rank(1, 2, port, timeout=5.0).finished()
        outcome, _ = rank_0.finished()
    finally:
        stray.close()
    assert joined[0] == UNIQUE_ID and outcome[0] == UNIQUE_ID


def test_a_flood_of_strays_cannot_keep_the_ranks_out(monkeypatch):
    monkeypatch.setattr(rendezvous, "MAX_PENDING", 4)
    port = free_port()
    rank_0 = Rank(0, 2, port, timeout=5.0)
    strays = [_connect(port) for _ in range(10)]
    try:
        assert _closed_by_the_other_side(strays[0], 2.0)  # the oldest, dropped for the newer ones
        joined, _ = Rank(1, 2, port, timeout=5.0).finished()
        outcome, _ = rank_0.finished()
    finally:
        for stray in strays:
            stray.close()
    assert joined[0] == UNIQUE_ID and outcome[0] == UNIQUE_ID


def test_a_rank_of_another_version_stops_the_rendezvous_with_the_reason():
    port = free_port()
    rank_0 = Rank(0, 2, port, timeout=5.0)
    other = _connect(port)
    try:
        other.sendall(_hello(magic=b"CDNN\x02"))
        outcome, seconds = rank_0.finished()
        other.settimeout(2.0)
        answer = other.recv(4096)
    finally:
        other.close()
    assert isinstance(outcome, DistributedError) and "another version of cudnnnet" in str(outcome)
    assert answer[:1] == b"\x01" and b"another version of cudnnnet" in answer
    assert seconds < 2.0


# ---- the launchers' variables and the timeouts -----------------------------------------------------------
@pytest.mark.parametrize("environ, problem", [
    ({"RANK": "\u00b2", "WORLD_SIZE": "2"}, "RANK='\u00b2' is not an integer from 0 to "),
    ({"RANK": "\u0661", "WORLD_SIZE": "2"}, "RANK='\u0661' is not an integer from 0 to "),
    ({"RANK": "0", "WORLD_SIZE": "9" * 5000}, "WORLD_SIZE='99999"),
    ({"RANK": "0", "WORLD_SIZE": str(2**40)}, f"WORLD_SIZE='{2**40}' is not an integer from 1 to "),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "\u00b9"}, "LOCAL_RANK='\u00b9' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "\u00b3"},
     "MASTER_PORT='\u00b3' is not an integer from 1 to 65535"),
])
def test_a_launcher_variable_int_would_not_take_is_refused_naming_it(environ, problem):
    with pytest.raises(DistributedError) as refused:
        distributed.from_environment(environ)
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200


@pytest.mark.parametrize("value", ["1e300", "1e9", "inf", "nan", "-1", "0", "soon", ""])
def test_a_rendezvous_timeout_out_of_range_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("CUDNNNET_RENDEZVOUS_TIMEOUT", value)
    with pytest.raises(UsageError, match=f"CUDNNNET_RENDEZVOUS_TIMEOUT={value!r} is not a number of seconds above 0 "
                                         f"and at most 604800"):
        rendezvous.meet(_launch(0, 2, free_port()), DIGEST, lambda: UNIQUE_ID)


@pytest.mark.parametrize("value", ["1e300", "inf", "nan", "-5"])
def test_a_heartbeat_timeout_out_of_range_is_refused_before_the_rendezvous(monkeypatch, value):
    monkeypatch.setenv("CUDNNNET_HEARTBEAT_TIMEOUT", value)
    with pytest.raises(UsageError, match=f"CUDNNNET_HEARTBEAT_TIMEOUT={value!r} is not a number of seconds"):
        distributed.rendezvous(_launch(0, 2, free_port()), DIGEST, lambda: UNIQUE_ID, 0.5)


def test_a_rank_variable_int_would_not_take_ends_cudnnnet_train_in_one_line(monkeypatch, capsys, tmp_path):
    from cudnnnet.cli import launch

    monkeypatch.chdir(tmp_path)
    for name, value in {"RANK": "\u00b2", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert launch.train(["--config", "mnist_mlp", "--device", "host", "--output", str(tmp_path / "run")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["cudnnnet-train: error: RANK='\u00b2' is not an integer from 0 to 1048575"]
