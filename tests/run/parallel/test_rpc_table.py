"""Each role declares its RPC methods once (`RPC` on its class): the server
binds exactly those, the launcher's ones as control methods, and the table
in docs/parallel.md is the one the declarations give."""

import launch
from embodied.run import connections
from embodied.run import parallel


class RecordingServer:
    def __init__(self):
        self.bound = {}

    def bind(self, name, workfn, control=False, **kwargs):
        self.bound[name] = (workfn, control, kwargs)


class Role:
    RPC = {'work': 'actor', 'status': connections.LAUNCHER,
           'shutdown': connections.LAUNCHER}

    def work(self):
        return 'work'

    def status(self):
        return 'status'


def test_bind_role_binds_each_declared_method_launcher_ones_as_control():
    server, role = RecordingServer(), Role()
    stop = lambda: 'stop'
    connections.bind_role(
        server, role, shutdown=stop, work=dict(workfn=role.work, batch=4))
    assert set(server.bound) == {'work', 'status', 'shutdown'}
    assert server.bound['work'] == (role.work, False, {'batch': 4})
    assert server.bound['status'] == (role.status, True, {})
    assert server.bound['shutdown'] == (stop, True, {})


def test_every_declared_method_exists_on_its_role():
    for _, _, cls in parallel.SERVERS:
        for method in cls.RPC:
            assert hasattr(cls, method), (cls, method)


def test_every_role_serves_the_control_protocol_to_the_launcher():
    from embodied.run.parallel import lifecycle
    for _, role, cls in parallel.SERVERS:
        if cls is parallel.ActorRole:
            continue  # `act` only; the agent's control shares its server.
        served = {m for m, caller in cls.RPC.items()
                  if caller == connections.LAUNCHER}
        assert set(lifecycle.CONTROL) <= served, role
        assert served - set(lifecycle.CONTROL) <= {'abandon'}, role
        assert cls.STAGES and all(
            hasattr(cls, f'_stop_{stage}') for stage in cls.STAGES), role


def test_docs_show_the_declared_table():
    text = (launch.ROOT / 'docs' / 'parallel.md').read_text()
    assert parallel.rpc_table() in text
