"""Damaged saves on resume: named, skipped, and the run resumes from the
newest complete save common to every role."""

import json
import os
import pickle
import re

import elements
import numpy as np
import pytest

import launch
from embodied.core import checkpoint as cplib
from embodied.core import replay as replaylib
from embodied.run import saving
from tests.run.parallel.test_faults import run_failing
from tests.run.parallel.test_parallel import run_to_end

FAST = ('--run.envs', '2', '--run.eval_envs', '0')


class Value:
    """A saveable holding one value."""

    def __init__(self, value=None):
        self.value = value

    def save(self):
        return {'value': self.value, 'pad': b'x' * 200}

    def load(self, data):
        self.value = data['value']


def args_for(logdir, keep=3):
    return elements.Config(logdir=str(logdir), save_keep=keep)


def save_run(logdir, tags, keep=3):
    """Saves agent, replay and logger of a run under each of `tags`."""
    args = args_for(logdir, keep)
    for tag in tags:
        for role in saving.ROLES:
            cp = saving.role_checkpoint(args, role, **{role: Value(tag)})
            cp.save(tag)


def save_file(logdir, role, tag, suffix='json'):
    return logdir / 'ckpt' / role / f'{tag:012d}' / f'{role}.{suffix}'


@pytest.mark.parametrize('suffix', ['json', 'safetensors'])
@pytest.mark.parametrize('role', saving.ROLES)
@pytest.mark.parametrize('cut', ['truncate', 'delete', 'empty'])
def test_damaged_newest_save_is_named_and_skipped(
        tmp_path, capsys, role, cut, suffix):
    logdir = tmp_path / 'run'
    save_run(logdir, [100, 200, 300])
    damaged = save_file(logdir, role, 300, suffix)
    if cut == 'truncate':
        os.truncate(damaged, 58)
    elif cut == 'delete':
        damaged.unlink()
    else:
        os.truncate(damaged, 0)
    assert saving.resume_tag(logdir) == 200
    assert str(damaged) in capsys.readouterr().out

    loaded = {role: Value() for role in saving.ROLES}
    cps = [saving.role_checkpoint(args_for(logdir), r, **{r: loaded[r]})
           for r in saving.ROLES]
    assert saving.resume(logdir, cps) == 200
    assert all(v.value == 200 for v in loaded.values())
    # The newer saves are set aside (the damaged one marked), not pruned in
    # favour of the saves that follow, and never loaded again.
    for cp in cps:
        assert cp.tags() == [100, 200]
    names = os.listdir(logdir / 'ckpt' / role)
    assert any(n.startswith('damaged-000000000300') for n in names), names


def test_unused_save_goes_once_every_kept_save_is_newer(tmp_path):
    # A crash between the roles' saves of step 300: agent and logger hold
    # it, the replay does not. The resume sets it aside; it stays while it
    # is among the newest steps kept, then goes like any pruned save.
    logdir = tmp_path / 'run'
    save_run(logdir, [100, 200])
    for role in ('agent', 'logger'):
        cp = saving.role_checkpoint(args_for(logdir), role, **{role: Value()})
        cp.save(300)
    cps = {r: saving.role_checkpoint(args_for(logdir), r, **{r: Value()})
           for r in saving.ROLES}
    assert saving.resume(logdir, cps.values()) == 200

    def unused(role):
        return [n for n in os.listdir(logdir / 'ckpt' / role)
                if n.startswith('unused-000000000300-')]

    for step in (250, 280, 320, 350, 380):
        for cp in cps.values():
            cp.save(step)
        held = step < 380  # Until then, the oldest kept save is before 300.
        for role in ('agent', 'logger'):
            assert bool(unused(role)) == held, (step, role)
    for role, cp in cps.items():
        assert cp.tags() == [320, 350, 380]
        assert sorted(os.listdir(logdir / 'ckpt' / role)) == [
            f'{t:012d}' for t in (320, 350, 380)]


def save_pickles(logdir, tags):
    """Saves of every role as versions before the new format wrote them:
    one pickle per entry, a `done` manifest of their sizes."""
    for tag in tags:
        for role in saving.ROLES:
            folder = logdir / 'ckpt' / role / f'{tag:012d}'
            folder.mkdir(parents=True)
            content = pickle.dumps({'value': tag, 'pad': b'x' * 200})
            (folder / f'{role}.pkl').write_bytes(content)
            (folder / 'done').write_text(
                json.dumps({'files': {f'{role}.pkl': len(content)}}))


def test_save_older_than_the_manifest_is_checked_by_its_pickle_end(tmp_path):
    logdir = tmp_path / 'run'
    save_pickles(logdir, [100, 200])
    for role in saving.ROLES:  # As written before the manifest existed.
        (logdir / 'ckpt' / role / f'{200:012d}' / 'done').write_bytes(b'')
    assert saving.resume_tag(logdir) == 200
    os.truncate(logdir / 'ckpt' / 'agent' / f'{200:012d}' / 'agent.pkl', 58)
    assert saving.resume_tag(logdir) == 100


def test_save_without_its_manifest_is_checked_by_its_headers(tmp_path):
    # A manifest lost (emptied by hand): a cut array file still shows, by
    # the length its header gives, and a cut JSON file by its end.
    logdir = tmp_path / 'run'
    save_run(logdir, [100, 200, 300])
    for tag in (200, 300):
        for role in saving.ROLES:
            (logdir / 'ckpt' / role / f'{tag:012d}' / 'done').write_bytes(b'')
    assert saving.resume_tag(logdir) == 300
    os.truncate(save_file(logdir, 'agent', 300, 'safetensors'), 120)
    assert saving.resume_tag(logdir) == 200
    path = save_file(logdir, 'logger', 200)
    os.truncate(path, os.path.getsize(path) - 2)
    assert saving.resume_tag(logdir) == 100


def garbled(content):
    """A save's JSON of the same size that reads as no save."""
    assert b'"embodied.save"' in content
    return content.replace(b'"embodied.save"', b'"embodied.xxxx"')


def test_unreadable_file_is_named_when_loaded(tmp_path):
    cp = cplib.Checkpoint(tmp_path / 'ckpt')
    cp.agent = Value(1)
    cp.save(5)
    path = tmp_path / 'ckpt' / f'{5:012d}' / 'agent.json'
    # Whole JSON of the same size, but not what the save wrote (a hand
    # edit): only reading it shows.
    path.write_bytes(garbled(path.read_bytes()))
    assert cplib.damage(tmp_path / 'ckpt' / f'{5:012d}') is None
    with pytest.raises(cplib.DamagedCheckpoint, match=re.escape(str(path))):
        cp.load(5)
    assert cp.tags() == []  # Set aside: the next start skips it.


def test_single_process_restore_keeps_run_save_keep(tmp_path):
    logdir = tmp_path / 'run'
    cp = saving.RunCheckpoint(args_for(logdir, keep=4))
    for role in saving.ROLES:
        setattr(cp[role], role, Value(0))
    for tag in range(1, 7):
        cp.save(tag)
    for role in saving.ROLES:
        assert cp[role].tags() == [3, 4, 5, 6]


def test_deleted_replay_chunk_is_reported_on_load(tmp_path, capsys):
    directory = tmp_path / 'replay'
    make = lambda: replaylib.Replay(
        length=2, capacity=100, chunksize=4, directory=directory,
        save_wait=True)
    replay = make()
    for i in range(20):
        replay.add({'count': np.int32(i)}, worker=0)
    data = replay.save()
    lost = sorted(directory.glob('*.npz'))[0]
    lost.unlink()
    capsys.readouterr()
    make().load(pickle.loads(pickle.dumps(data)))
    out = capsys.readouterr().out
    assert 'missing' in out and lost.name.split('-')[1] in out, out


@pytest.mark.slow
def test_parallel_resume_skips_damaged_newest_save(tmp_path):
    logdir = tmp_path / 'run'
    flags = (*FAST, '--run.save_every', '1e6')
    # Three complete saves: the first one, a periodic one, the final one.
    run_to_end(logdir, '--run.steps', '200', *flags, name='first')
    run_to_end(logdir, '--run.steps', '400', *flags, name='second')
    tags = launch.saved_tags(logdir, 'agent')
    assert len(tags) >= 2, tags
    newest, older = tags[-1], tags[-2]
    damaged = save_file(logdir, 'agent', newest)
    os.truncate(damaged, 58)
    output = run_to_end(
        logdir, '--run.steps', str(newest + 150), *flags, name='third')
    assert str(damaged) in output
    assert f'Learner resumed the agent from the save at step {older}' in output
    assert f'Logger resumed at step {older}' in output
    assert f'Replay resumed from the save at step {older}' in output
    assert 'BrokenBarrierError' not in output


@pytest.mark.slow
def test_parallel_unreadable_save_fails_naming_file_then_resumes(tmp_path):
    logdir = tmp_path / 'run'
    flags = (*FAST, '--run.save_every', '1e6')
    run_to_end(logdir, '--run.steps', '200', *flags, name='first')
    run_to_end(logdir, '--run.steps', '400', *flags, name='second')
    newest, older = launch.saved_tags(logdir, 'agent')[-2:][::-1]
    path = save_file(logdir, 'agent', newest)
    path.write_bytes(garbled(path.read_bytes()))
    output = run_failing(logdir, '--run.steps', str(newest + 150), *flags,
                         name='third')
    assert str(path) in output
    assert 'BrokenBarrierError' not in output
    output = run_to_end(
        logdir, '--run.steps', str(newest + 150), *flags, name='fourth')
    assert f'Learner resumed the agent from the save at step {older}' in output
