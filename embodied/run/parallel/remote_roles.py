"""Roles started as separate commands: the command that starts one (this
command's own line with `--script` replaced and the `run.remote_*` flags
dropped, so every address and config flag matches), where the run's secret
comes from, and the launcher's word when no env worker arrived."""

import os
import shlex
import sys

from embodied.rpc import auth
from embodied.run.parallel import roles

# The command that starts each separately started role, by its flag.
SCRIPTS = {flag: role.scripts[0] for flag, role in roles.SEPARATE.items()}
_DROPPED = tuple(f'--run.{flag}' for flag in roles.SEPARATE)


def secret_origin(args):
    """Where the launch's secret comes from: 'flag', 'env', 'file' (the
    logdir's, which roles started as separate commands and other replicas
    read too) or 'new' (this launch's alone); None with run.auth False."""
    if not args.auth:
        return None
    if args.secret:
        return 'flag'
    if os.environ.get(auth.ENV_VAR):
        return 'env'
    if args.remote_envs or args.remote_replay or args.replicas > 1:
        return 'file'
    return 'new'


def credentials(args, origin):
    """The launch's credentials (see `rpc.auth`) from its secret's
    `origin`; None with run.auth False."""
    if origin is None:
        return None
    return auth.Credentials.decode(
        args.secret or os.environ.get(auth.ENV_VAR) or (
            auth.secret_file(args.logdir) if origin == 'file' else
            auth.new_secret()))


def secret_hint(args, origin):
    """How a role's command gets the run's secret."""
    if origin is None:
        return 'run.auth is False: no secret is needed'
    if origin == 'flag':
        return 'give it the same --run.secret'
    if origin == 'env':
        return f'run it with the same {auth.ENV_VAR} as this command'
    path = os.path.join(str(args.logdir), 'secret')
    return (f'on a machine that shares this logdir it reads {path} as is; '
            f'elsewhere, prefix the command with {auth.ENV_VAR}=<the '
            f'contents of {path}>')


def command(script, argv=None):
    """This command's line with `--script script` and no run.remote_* flags;
    None when this process was not started from a command line with a
    `--script` flag (e.g. `combined` called from Python)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    flags, found = [], False
    while argv:
        arg = argv.pop(0)
        name = arg.split('=', 1)[0]
        if name in _DROPPED or name == '--script':
            if '=' not in arg and argv:
                argv.pop(0)  # Its value.
            if name == '--script':
                found = True
                flags += ['--script', script]
            continue
        flags.append(arg)
    return shlex.join(['python', *program(), *flags]) if found else None


def program():
    """How this process was started: `['-m', module]` or `[script]`."""
    main = sys.modules.get('__main__')
    spec = getattr(main, '__spec__', None)
    if spec is not None and spec.name:
        name = spec.name.removesuffix('.__main__')
        return ['-m', name]
    return [sys.argv[0]]


def start_lines(args, origin, argv=None):
    """The lines printed at the start of a launch with remote roles."""
    lines = []
    for flag, script in SCRIPTS.items():
        if not args.get(flag):
            continue
        cmd = command(script, argv) or (
            f'python -m embodied.main --script {script} <this run\'s flags>')
        lines.append(f'Start the {script} command ({flag}) with: {cmd}')
        lines.append(f'  Its secret: {secret_hint(args, origin)}.')
    return lines


def no_envs_message(args, status, origin, argv=None):
    """The launcher's error when no env worker reached the actor."""
    text = (f'No env worker reached the actor at {args.actor_addr} within '
            f'{args.connect_timeout} s (run.connect_timeout).')
    refused = int(status.get('server/refused', 0))
    if refused:
        hosts = dict.fromkeys(
            peer.rsplit(':', 1)[0] for peer in status.get('refused_from', ()))
        text += (f' The actor refused {refused} connection'
                 f'{"s" if refused != 1 else ""} with a wrong or missing '
                 f'secret, from {", ".join(hosts) or "unknown peers"}: '
                 f'commands started with another run secret.')
    cmd = command('parallel_envs', argv) or (
        'python -m embodied.main --script parallel_envs <this run\'s flags>')
    return (f'{text} Start env workers with: {cmd} ({secret_hint(args, origin)}).')
