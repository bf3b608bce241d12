"""PinPad: the layouts, the reward for the right sequence, the countdown and
respawn, the image, the episode length; and, where the original is checked
out (EMBODIED_ORIGINAL_DREAMERV3), the same frames and rewards as its
PinPad for the same spawns and actions."""

import collections
import os
import pathlib
import types

import numpy as np
import pytest

from embodied.core.wrappers import check_values
from embodied.envs import pinpad

ORIGINAL = os.environ.get('EMBODIED_ORIGINAL_DREAMERV3', '')


class Spawns:
    """Stands in for both envs' random generators: hands out the spawn
    indices of a list in turn (numpy's `integers` and `randint`)."""

    def __init__(self, indices):
        self.indices = list(indices)

    def integers(self, n):
        return self.indices.pop(0) % n

    randint = integers


def path_to(layout, start, goal):
    """The actions of a shortest walk from `start` to a cell of `goal` that
    crosses no other pad (but the one it starts on)."""
    allowed = (' ', goal, layout[start])
    queue = collections.deque([(start, [])])
    seen = {start}
    while queue:
        (x, y), actions = queue.popleft()
        if layout[x, y] == goal:
            return actions
        for action, (dx, dy) in enumerate(pinpad.MOVES[1:], 1):
            cell = (x + dx, y + dy)
            if layout[cell] in allowed and cell not in seen:
                seen.add(cell)
                queue.append((cell, actions + [action]))
    raise AssertionError(f'no path to {goal}')


def solving_actions(env):
    actions, cell = [], env.player
    for pad in env.target:
        steps = path_to(env.layout, cell, pad)
        for action in steps:
            dx, dy = pinpad.MOVES[action]
            cell = (cell[0] + dx, cell[1] + dy)
        actions += steps
    return actions


def act(env, action, reset=False):
    return env.step({'action': np.int32(action), 'reset': reset})


@pytest.mark.parametrize('task', sorted(pinpad.LAYOUTS))
def test_layout_and_spaces(task):
    env = pinpad.PinPad(task, seed=0)
    assert env.layout.shape == (16, 14)
    assert len(env.target) == ['three', 'four', 'five', 'six', 'seven',
                               'eight'].index(task) + 3
    assert (env.layout[0] == '#').all() and (env.layout[:, -1] == '#').all()
    assert env.act_space['action'].high == 5
    obs = act(env, 0, reset=True)
    check_values('obs', obs, env.obs_space)
    assert obs['image'].shape == (64, 64, 3) and obs['is_first']


def test_right_sequence_is_rewarded_then_countdown_and_respawn():
    env = pinpad.PinPad('three', length=1000, seed=0)
    env.rng = Spawns([0, 5])
    act(env, 0, reset=True)
    rewards = [act(env, a)['reward'] for a in solving_actions(env)]
    assert rewards[-1] == 10.0 and sum(rewards) == 10.0
    # Green background for 10 steps, no second reward; then a respawn at
    # the next spawn with an empty sequence.
    floor = next(cell for cell, c in np.ndenumerate(env.layout) if c == ' ')
    pixel = (4 * floor[1], 4 * floor[0])
    obs = act(env, 0)
    assert tuple(obs['image'][pixel]) == pinpad.SOLVED
    for _ in range(8):
        assert act(env, 0)['reward'] == 0
    assert env.player != env.spawns[5] and len(env.sequence) == 3
    obs = act(env, 0)
    assert env.player == env.spawns[5] and not env.sequence
    assert tuple(obs['image'][pixel]) == (255, 255, 255)


def test_wrong_order_and_repeats_are_not_rewarded():
    env = pinpad.PinPad('three', seed=0)
    env.rng = Spawns([env.spawns.index((8, 7))])
    act(env, 0, reset=True)
    rewards = []
    for pad in ('2', '1', '1', '3'):
        for action in path_to(env.layout, env.player, pad):
            rewards.append(act(env, action)['reward'])
        rewards.append(act(env, 0)['reward'])  # Standing still adds nothing.
    assert sum(rewards) == 0
    assert tuple(env.sequence) == ('2', '1', '3')


def test_image_shows_walls_pads_player_and_sequence():
    env = pinpad.PinPad('three', seed=0)
    env.rng = Spawns([env.spawns.index((8, 7))])  # A floor cell.
    image = act(env, 0, reset=True)['image']
    x, y = env.player
    assert tuple(image[4 * y + 1, 4 * x + 1]) == (0, 0, 0)
    assert tuple(image[1, 1]) == pinpad.WALL
    assert tuple(image[-1, 30]) == pinpad.WALL  # The sequence strip.
    pad = next(cell for cell, c in np.ndenumerate(env.layout) if c == '3')
    assert tuple(image[4 * pad[1], 4 * pad[0]]) == (229, 229, 255)  # pale
    for action in path_to(env.layout, env.player, '3'):
        image = act(env, action)['image']
    # On the pad: its colour in full, and the pad in the sequence strip.
    x, y = next(cell for cell, c in np.ndenumerate(env.layout)
                if c == '3' and cell != env.player)
    assert tuple(image[4 * y, 4 * x]) == (0, 0, 255)
    assert tuple(image[4 * 14, 4 * 1]) == (0, 0, 255)


def test_episode_lasts_length_steps_and_never_terminates():
    env = pinpad.PinPad('four', length=7, seed=1)
    obs = act(env, 0, reset=True)
    flags = []
    while not obs['is_last']:
        obs = act(env, np.random.default_rng(len(flags)).integers(5))
        flags.append(obs['is_terminal'])
    assert len(flags) == 7 and not any(flags)
    assert act(env, 0)['is_first']


def test_seed_fixes_the_spawns():
    first = [pinpad.PinPad('five', seed=3) for _ in range(2)]
    other = pinpad.PinPad('five', seed=4)
    images = [act(env, 0, reset=True)['image'] for env in (*first, other)]
    np.testing.assert_array_equal(images[0], images[1])
    assert first[0].player != other.player or (
        act(first[0], 0, reset=True)['image'] != act(
            other, 0, reset=True)['image']).any()


def test_bad_task_names_the_tasks():
    with pytest.raises(ValueError, match="Unknown PinPad task 'nine'.*three"):
        pinpad.PinPad('nine')


def load_original():
    """The original's PinPad class, with a stand-in for its `embodied`."""
    source = pathlib.Path(ORIGINAL) / 'embodied' / 'envs' / 'pinpad.py'
    if not source.exists():
        pytest.skip(f'{source} does not exist')
    module = types.ModuleType('original_pinpad')
    code = source.read_text().replace(
        'import embodied\n', 'embodied = __import__("types").SimpleNamespace('
        'Env=object)\n')
    exec(compile(code, str(source), 'exec'), module.__dict__)
    return module.PinPad


@pytest.mark.skipif(not ORIGINAL, reason='EMBODIED_ORIGINAL_DREAMERV3 is not set')
@pytest.mark.parametrize('task', sorted(pinpad.LAYOUTS))
def test_same_frames_and_rewards_as_the_original(task, capsys):
    original = load_original()(task, length=400)
    ours = pinpad.PinPad(task, length=400)
    spawns = np.random.default_rng(0).integers(1000, size=50).tolist()
    original.random, ours.rng = Spawns(spawns), Spawns(spawns)
    rng = np.random.default_rng(1)
    solve, total = [], 0.0
    for t in range(900):
        if not solve and t and not ours.countdown:
            solve = solving_actions(ours) if t % 3 else [
                int(rng.integers(5)) for _ in range(20)]
        move = solve.pop(0) if solve else 0
        action = {'action': np.int32(move), 'reset': t == 0}
        a, b = original.step(action), ours.step(action)
        for key in ('image', 'reward', 'is_first', 'is_last', 'is_terminal'):
            np.testing.assert_array_equal(a[key], b[key], f'{key} at {t}')
        total += b['reward']
    assert total >= 30
