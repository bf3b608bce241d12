"""Who may talk to a run's servers: a per-run secret in the handshake.

portal's wire format opens every connection with a fixed handshake string.
Here that string carries a token derived from the run's secret, so a peer
without the secret is dropped before it can send a single request, and
before any frame of it is buffered:

    portal_handshake:<64 hex>     instead of     portal_handshake

Two tokens come from one secret: the data token, which every worker of the
run holds (env workers, actor, learner, replay, logger), and the control
token, which only the launcher holds. A server accepts both; a connection
opened with the control token may also call the control methods (save,
shutdown, ...). Workers receive the data token and the digest of the
control token, never the secret itself (`Credentials.for_workers`).

    creds = Credentials.from_secret(secret)   # launcher, or a role started
    creds.handshake(control=True)              # on its own with the secret
    creds.for_workers().encode()               # handed to worker processes
    Credentials.decode(text)                   # a worker's credentials

A server answers a peer that opened with a token with a verdict frame before
anything else, in portal's frame format with a request number no request
uses: accepted, or refused (the token is not the run's). A refused peer is
then dropped without a byte of request data read, and learns why instead
of seeing only a closed connection (`read_verdict`, `refusal_message`).

What it protects: other local users and processes (and, where servers bind a
public host, other machines) cannot call, stop or flood a run. What it does
not: the token crosses the connection in clear text and nothing is
encrypted (no TLS), so it is no defence against someone who can read the
traffic; servers bind loopback by default for that reason.
"""

import dataclasses
import hashlib
import hmac
import os
import secrets
import socket

from . import status

PORTAL_HANDSHAKE = 'portal_handshake'  # What portal and opted-out peers send.
ENV_VAR = 'EMBODIED_SECRET'
_ENCODED = 'embodied-credentials-v1'
VERDICT_REQNUM = b'\xff' * 8  # The verdict frame's request number.
_MAX_VERDICT = 4096


def _derive(secret, purpose):
    return hmac.new(
        secret.encode('utf-8'), purpose.encode(), hashlib.sha256).hexdigest()


def _digest(token):
    return hashlib.sha256(token.encode()).hexdigest()


def new_secret():
    return secrets.token_hex(32)


@dataclasses.dataclass(frozen=True)
class Credentials:

    data: str             # The data token (64 hex).
    control_digest: str   # sha256 of the control token.
    control: str = ''     # The control token; only the launcher holds it.

    @classmethod
    def from_secret(cls, secret):
        control = _derive(secret, 'control')
        return cls(_derive(secret, 'data'), _digest(control), control)

    @classmethod
    def decode(cls, text):
        """Credentials from `encode()`, or from a plain secret."""
        parts = str(text).split(':')
        if len(parts) in (3, 4) and parts[0] == _ENCODED:
            return cls(*parts[1:])
        return cls.from_secret(str(text))

    def encode(self):
        return ':'.join([_ENCODED, self.data, self.control_digest] + (
            [self.control] if self.control else []))

    def for_workers(self):
        """These credentials without the control token."""
        return dataclasses.replace(self, control='')

    def handshake(self, control=False):
        if control and not self.control:
            raise PermissionError('These credentials hold no control token.')
        return f'{PORTAL_HANDSHAKE}:{self.control if control else self.data}'

    def kind(self, handshake):
        """'control', 'data' or None for the handshake bytes a peer sent."""
        prefix = f'{PORTAL_HANDSHAKE}:'.encode()
        if not handshake.startswith(prefix):
            return None
        try:
            token = handshake[len(prefix):].decode('ascii')
        except UnicodeDecodeError:
            return None
        if hmac.compare_digest(token, self.data):
            return 'data'
        if hmac.compare_digest(_digest(token), self.control_digest):
            return 'control'
        return None


def secret_file(logdir, create=True):
    """The secret kept in `logdir/secret` (mode 0600), created atomically by
    the first command of a run that asks for it, so that roles started as
    separate commands on one logdir share it without being told."""
    path = os.path.join(str(logdir), 'secret')
    if not os.path.exists(path) and create:
        os.makedirs(str(logdir), exist_ok=True)
        tmp = f'{path}.tmp-{secrets.token_hex(4)}'
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, 'w') as f:
            f.write(new_secret())
        try:
            os.link(tmp, path)  # Fails if another command was first.
        except FileExistsError:
            pass
        finally:
            os.remove(tmp)
    with open(path) as f:
        return f.read().strip()


def expects_verdict(handshake):
    """Whether a server answers `handshake` with a verdict: it carries a
    token, which only servers with `auth` accept."""
    return bool(handshake) and handshake.startswith(f'{PORTAL_HANDSHAKE}:')


def verdict_frame(accepted, server):
    """The frame a server sends after a token handshake; `server` is its
    name (e.g. `Actor`), for the peer's messages."""
    code = status.OK if accepted else status.REFUSED
    body = VERDICT_REQNUM + status.header(code) + (
        server.encode('utf-8')[:256])
    return len(body).to_bytes(8, 'little') + body


def parse_verdict(message):
    """(accepted, server name) for a received frame's body, or None when it
    is no verdict."""
    if len(message) < 16 or bytes(message[:8]) != VERDICT_REQNUM:
        return None
    accepted = status.read(message) == status.OK
    return accepted, bytes(message[16:]).decode('utf-8', 'replace')


class NoVerdict(ConnectionError):
    """A server answered a token handshake without a verdict: it closed the
    connection or sent something else, as a server that checks no tokens
    (run.auth False, or portal's own) does."""


# Token handshakes in a row answered without a verdict before a client
# says that run.auth differs; one alone may be a server that is ending.
NO_VERDICTS = 3


def read_verdict(sock):
    """Reads the verdict frame from a blocking socket right after the
    handshake: (accepted, server name). Raises NoVerdict when the server
    closed or sent something else."""
    def read(size):
        data = b''
        while len(data) < size:
            part = sock.recv(size - len(data))
            if not part:
                raise ConnectionResetError('closed before its verdict')
            data += part
        return data
    try:
        length = int.from_bytes(read(8), 'little')
        if not 16 <= length <= _MAX_VERDICT:
            raise NoVerdict(f'a frame of {length} bytes instead of a verdict')
        verdict = parse_verdict(read(length))
    except socket.timeout:
        raise NoVerdict('no verdict on the handshake') from None
    except ConnectionError as e:
        raise NoVerdict(str(e)) from None
    if verdict is None:
        raise NoVerdict('a reply instead of a verdict')
    return verdict


def auth_mismatch(client, server, addr, own):
    """What a peer prints when it and the server it reached differ in
    run.auth; `own` is this command's run.auth, the server has the other."""
    server = server or 'the server'
    if own:
        how = (f'{server} at {addr} answered this command\'s token without a '
               f'verdict, as a server with run.auth False does')
        fix = ('add --run.auth False to this command, or drop it from the '
               'main command')
    else:
        how = f'{server} at {addr} refused this command'
        fix = ('drop --run.auth False from this command, or give the main '
               'command --run.auth False too')
    return (f'{client}: {how}: run.auth differs (the server has run.auth '
            f'{not own}, this command run.auth {own}). Start every command '
            f'of the run with the same run.auth: {fix}.')


def still_refused(client, server, addr):
    """The shorter line for a refusal that was reported before."""
    return (f'{client}: {server or "the server"} at {addr} still refuses '
            f'this command\'s run secret (see above); retrying until '
            f'run.connect_timeout.')


def refusal_message(client, server, addr):
    """What a refused peer prints: who refused it, why, and what to set."""
    server = server or 'the server'
    return (
        f'{client}: {server} at {addr} refused this command: its run secret '
        f'differs (wrong or missing secret). Set {ENV_VAR} to the main '
        f'command\'s secret, e.g. {ENV_VAR}="$(cat MAIN_LOGDIR/secret)" '
        f'when the main command keeps it in its logdir, or, where both '
        f'commands share a logdir, start this one with the main command\'s '
        f'--logdir.')
