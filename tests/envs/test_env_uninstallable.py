"""The suites whose packages CI cannot install (DeepMind Lab, MineRL) on
stand-ins of those packages that record what the env asks of them: the
action sets, repeats, resets, seeds and observations of DMLab, and the
actions, sticky keys, pitch limit, observations and rewards of Minecraft.
The real packages were never run here (docs/suites.md)."""

import sys
import types

import numpy as np
import pytest

from embodied.core.wrappers import check_values
from embodied.envs import dmlab
from embodied.envs import minecraft


class FakeLab:
    """deepmind_lab.Lab: 3 frames of 4 steps each per episode."""

    made = []

    def __init__(self, level, observations, config):
        self.level, self.observations_, self.config = (
            level, observations, config)
        self.calls = []
        self.frames = 0
        FakeLab.made.append(self)

    def reset(self, seed):
        self.calls.append(('reset', seed))
        self.frames = 0

    def step(self, action, num_steps):
        self.calls.append(('step', tuple(action), num_steps))
        self.frames += 1
        return float(self.frames)

    def is_running(self):
        return self.frames < 3

    def observations(self):
        height, width = int(self.config['height']), int(self.config['width'])
        obs = {'RGB_INTERLEAVED': np.full(
            (height, width, 3), self.frames, np.uint8)}
        if 'INSTR' in self.observations_:
            obs['INSTR'] = 'Pick the red ball'
        return obs

    def close(self):
        pass


@pytest.fixture
def fake_lab(monkeypatch):
    monkeypatch.setitem(
        sys.modules, 'deepmind_lab', types.SimpleNamespace(Lab=FakeLab))
    FakeLab.made.clear()
    return FakeLab


def test_dmlab_steps_with_the_action_set_and_repeat(fake_lab):
    env = dmlab.DMLab('rooms_watermaze', size=(48, 32), seed=1)
    lab = fake_lab.made[-1]
    assert lab.level == 'contributed/dmlab30/rooms_watermaze'
    assert lab.config == {'height': '48', 'width': '32', 'logLevel': 'WARN'}
    assert env.act_space['action'].high == 15 and 'instr' not in env.obs_space
    obs = env.step({'action': np.int32(0), 'reset': True})
    check_values('obs', obs, env.obs_space)
    assert obs['is_first'] and obs['image'].shape == (48, 32, 3)
    rewards, last = [], None
    for action in (13, 14, 6):
        last = env.step({'action': np.int32(action), 'reset': False})
        rewards.append(last['reward'])
    assert rewards == [1, 2, 3] and last['is_last'] and last['is_terminal']
    # The finished level has no frame: the last one is repeated.
    assert (last['image'] == 2).all()
    assert lab.calls[1:] == [
        ('step', (60, 0, 0, 1, 0, 0, 0), 4), ('step', (0, 0, 0, 0, 1, 0, 0), 4),
        ('step', (-60, 0, 0, 0, 0, 0, 0), 4)]
    seeds = [call[1] for call in lab.calls if call[0] == 'reset']
    assert seeds == [np.random.RandomState(1).randint(0, 2 ** 31 - 1)]


def test_dmlab_modes_text_and_episodic(fake_lab):
    env = dmlab.DMLab(
        'language_select_described_object_test', actions='impala',
        episodic=False, mode='train')
    lab = fake_lab.made[-1]
    assert lab.level.endswith('language_select_described_object_train')
    assert env.act_space['action'].high == 9
    obs = env.step({'action': np.int32(0), 'reset': True})
    assert obs['instr'].shape == (32 * 32,) and obs['instr'].dtype == np.float32
    again = dmlab.DMLab('language_select_described_object_test')
    np.testing.assert_array_equal(
        again.step({'action': np.int32(0), 'reset': True})['instr'],
        obs['instr'])
    for _ in range(3):
        obs = env.step({'action': np.int32(0), 'reset': False})
    assert obs['is_last'] and not obs['is_terminal']
    dmlab.DMLab('rooms_watermaze', mode='eval')
    assert fake_lab.made[-1].config['mixerSeed'] == str(0x600D5EED)


class Space(dict):
    """A gym Dict space: `spaces`, and `values` for an enum."""

    def __init__(self, spaces=None, values=None):
        super().__init__(spaces or {})
        self.spaces = self
        self.values = values


ITEMS = ('air', 'dirt', 'log', 'log2', 'planks', 'stick', 'crafting_table',
         'wooden_pickaxe', 'cobblestone', 'stone_pickaxe', 'iron_ore',
         'furnace', 'iron_ingot', 'iron_pickaxe', 'diamond')


class FakeMineRL:
    """MineRL's gym env; `gains` maps a step to inventory changes."""

    def __init__(self, resolution, break_speed, gains=None):
        self.resolution, self.break_speed = resolution, break_speed
        self.observation_space = Space({
            'inventory': Space({k: None for k in ITEMS}),
            'equipped_items': Space({'mainhand': Space({'type': Space(
                values=np.array(['air', 'wooden_pickaxe', 'other']))})})})
        self.gains = gains or {}
        self.actions = []

    def reset(self):
        self.inventory = {k: 0 for k in ITEMS}
        self.t, self.life, self.y = 0, 20, 64.0
        return self._obs()

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        for item, amount in self.gains.get(self.t, {}).items():
            if item == 'life':
                self.life += amount
            elif item == 'y':
                self.y += amount
            else:
                self.inventory[item] += amount
        return self._obs(), 0.0, False, {}

    def _obs(self):
        return {
            'pov': np.full((*self.resolution, 3), self.t, np.uint8),
            'inventory': dict(self.inventory),
            'equipped_items': {'mainhand': {'type': 'air'}},
            'life_stats': {'life': self.life, 'food': 20, 'air': 300},
            'location_stats': {'xpos': 0.0, 'ypos': self.y, 'zpos': 0.0}}

    def close(self):
        pass


def make_minecraft(task, gains=None, **kwargs):
    fakes = []

    def make(resolution, break_speed):
        fakes.append(FakeMineRL(resolution, break_speed, gains))
        return fakes[-1]
    return minecraft.Minecraft(task, make=make, **kwargs), fakes


def act(env, name, actions):
    index = list(actions).index(name)
    return env.step({'action': np.int32(index), 'reset': False})


def test_minecraft_wood_rewards_logs_and_health():
    env, (fake,) = make_minecraft('wood', gains={
        2: {'log': 1}, 3: {'log2': 2, 'life': -1}})
    obs = env.step({'action': np.int32(0), 'reset': True})
    check_values('obs', obs, env.obs_space)
    assert env.act_space['action'].high == 12
    rewards = [act(env, 'attack', minecraft.BASIC_ACTIONS)['reward']
               for _ in range(3)]
    # Health is observed in twentieths: a lost point is -0.01 / 20.
    np.testing.assert_allclose(rewards, [0, 1, 2 - 0.0005], rtol=1e-6)
    obs = act(env, 'noop', minecraft.BASIC_ACTIONS)
    assert obs['log/log'] == 3
    assert obs['inventory'][env.base._inv_keys.index('log')] == 3
    assert obs['health'] == np.float32(19 / 20)


def test_minecraft_diamond_rewards_each_item_once():
    env, _ = make_minecraft('diamond', gains={
        1: {'log': 1}, 2: {'log': 1, 'planks': 4}, 3: {'stick': 2}})
    env.step({'action': np.int32(0), 'reset': True})
    rewards = [act(env, 'noop', minecraft.DIAMOND_ACTIONS)['reward']
               for _ in range(4)]
    assert rewards == [1, 1, 1, 0]
    assert env.act_space['action'].high == 25


def test_minecraft_climb_rewards_height():
    env, _ = make_minecraft('climb', gains={2: {'y': 1.5}, 3: {'y': -0.5}})
    env.step({'action': np.int32(0), 'reset': True})
    rewards = [act(env, 'jump', minecraft.BASIC_ACTIONS)['reward']
               for _ in range(3)]
    assert rewards == [0, 1.5, -0.5]


def test_minecraft_sticky_jump_pitch_limit_and_length():
    env, (fake,) = make_minecraft('wood', length=5, break_speed=1.0)
    env.step({'action': np.int32(0), 'reset': True})
    act(env, 'attack', minecraft.BASIC_ACTIONS)
    act(env, 'noop', minecraft.BASIC_ACTIONS)  # Attack held (break_speed 1).
    act(env, 'jump', minecraft.BASIC_ACTIONS)  # A held attack drops jumps.
    assert [(a['attack'], a['jump']) for a in fake.actions] == [
        (1, 0), (1, 0), (1, 0)]
    for _ in range(2):
        obs = act(env, 'turn_down', minecraft.BASIC_ACTIONS)
    assert fake.actions[-1]['camera'] == (15, 0)
    assert obs['is_last'] and not obs['is_terminal']  # length 5
    env, (fake,) = make_minecraft('wood')
    env.step({'action': np.int32(0), 'reset': True})
    act(env, 'jump', minecraft.BASIC_ACTIONS)
    act(env, 'attack', minecraft.BASIC_ACTIONS)  # No held attack at 100.
    act(env, 'noop', minecraft.BASIC_ACTIONS)
    assert [(a['attack'], a['jump'], a['forward']) for a in fake.actions] == [
        (0, 1, 1), (1, 1, 1), (0, 1, 1)]  # The jump is held (with forward).
    fake.actions.clear()
    for name in ['turn_up'] * 5 + ['turn_down']:
        act(env, name, minecraft.BASIC_ACTIONS)
    # Looking up stops at -60 degrees: the fifth turn of -15 is dropped,
    # and a turn down then works at once.
    assert [a['camera'][0] for a in fake.actions] == [-15] * 4 + [0, 15]
    assert fake.break_speed == 100.0


def test_minecraft_bad_task_names_the_tasks():
    with pytest.raises(ValueError, match='minecraft_wood, minecraft_climb'):
        minecraft.Minecraft('house')
