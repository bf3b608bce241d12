"""Each role declares its RPC methods once (`RPC` on its class): the server
binds exactly those, the launcher's ones as control methods, and the table
in docs/parallel.md is the one the declarations give."""

import launch
from embodied.run.parallel import connections
from embodied.run import parallel
from embodied.run.parallel import roles


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


def servers():
    """(role, class) of every class a role's server serves."""
    return [(role, cls) for role in roles.SERVED for cls in role.classes()]


def test_every_declared_method_exists_on_its_role():
    for _, cls in servers():
        for method in cls.RPC:
            assert hasattr(cls, method), (cls, method)


def test_every_role_serves_the_control_protocol_to_the_launcher():
    from embodied.run.parallel import control
    for role, cls in servers():
        if cls is parallel.ActorRole:
            continue  # `act` only; the agent's control shares its server.
        served = {m for m, caller in cls.RPC.items()
                  if caller == connections.LAUNCHER}
        assert set(control.CONTROL) <= served, role
        assert served - set(control.CONTROL) <= {'abandon'}, role
        assert cls.STAGES and all(
            hasattr(cls, f'_stop_{stage}') for stage in cls.STAGES), role


def test_each_role_class_has_the_tables_name_and_stop_stages():
    from embodied.run.parallel import control
    controls = [(role, cls) for role, cls in servers()
                if issubclass(cls, control.RoleControl)]
    controls.append((roles.ROLES['envs'], control.EnvGroup))
    assert {role.name for role, _ in controls} == set(roles.ROLES)
    for role, cls in controls:
        assert cls.ROLE == role.name
        assert cls.STAGES == tuple(stage for stage, _ in role.stop)
        assert all(phase in roles.PHASES for _, phase in role.stop)


def test_the_table_names_each_role_once_and_derives_the_rest():
    assert len(roles.ROLES) == len(roles.TABLE)
    assert roles.ADDR_KEYS == (
        'actor_addr', 'agent_addr', 'replay_addr', 'logger_addr')
    assert roles.SAVED == ('agent', 'replay', 'logger')
    from embodied.run import saving
    from embodied.run import validation
    from embodied.run.parallel import remote_roles
    assert saving.ROLES == roles.SAVED
    assert remote_roles.SCRIPTS == {
        'remote_replay': 'parallel_replay', 'remote_envs': 'parallel_envs'}
    import embodied.main
    for role in roles.TABLE:
        assert role.entry is None or callable(role.function())
        assert set(role.scripts) <= set(embodied.main.SCRIPTS)
    del validation  # Its address checks read roles.ADDR_KEYS.


def test_docs_show_the_declared_tables():
    text = (launch.ROOT / 'docs' / 'parallel.md').read_text()
    assert parallel.rpc_table() in text
    assert parallel.roles_table() in text


def test_every_run_key_the_table_names_has_a_default():
    from embodied.run import arguments
    defaults = arguments.defaults()
    for role in roles.TABLE:
        keys = [role.addr, role.separate, role.cede,
                role.only and role.only[0],
                role.process if isinstance(role.process, str) else None]
        for key in filter(None, keys):
            assert key in defaults, (role.name, key)


def test_the_policy_worker_takes_the_actors_address_in_process_mode():
    from embodied.run import arguments
    for mode, names, agent_key in (
            ('thread', ['agent', 'replay', 'logger'], 'actor_addr'),
            ('process', ['policy', 'agent', 'replay', 'logger'],
             'agent_addr')):
        args = arguments.normalize(dict(logdir='/tmp/x', policy_worker=mode))
        assert [role.name for role in roles.served(args)] == names
        assert roles.addr_key('agent', args) == agent_key
        assert roles.addr_key('policy', args) == 'actor_addr'
        assert connections.is_remote(
            args.update(remote_envs=True), names[0])
    # Its status completes the agent's in the progress lines.
    assert roles.joined('agent', args) == ['agent', 'policy']


def test_auto_is_thread_on_cpu_and_process_on_gpu_with_replicas_too():
    from embodied.run import arguments
    args = dict(logdir='/tmp/x', policy_worker='auto')
    assert arguments.policy_worker(args, 'cpu') == 'thread'
    assert arguments.policy_worker({**args, 'replicas': 2}, 'cpu') == (
        'thread')
    assert arguments.policy_worker(args, 'cuda') == 'process'
    assert arguments.policy_worker({**args, 'replicas': 2}, 'cuda') == (
        'process')
    assert arguments.normalize(args).policy_worker in ('thread', 'process')
