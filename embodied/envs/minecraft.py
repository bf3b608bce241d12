"""Minecraft: tasks `minecraft_wood`, `minecraft_climb` and
`minecraft_diamond`, played in MineRL (the `minecraft` extra: minerl
0.4.4, which builds Minecraft at install time and needs a Java 8 JDK).
minerl is imported only when an env is built.
"""

import threading

import elements
import numpy as np

from embodied.core import base
from embodied.core import wrappers
from embodied.envs import packages

HOW = ('minerl 0.4.4 also needs a Java 8 JDK and downloads Minecraft while '
       'it installs: https://minerl.readthedocs.io/en/v0.4.4/tutorials/'
       'index.html')

NOOP = dict(
    camera=(0, 0), forward=0, back=0, left=0, right=0, attack=0, sprint=0,
    jump=0, sneak=0, craft='none', nearbyCraft='none', nearbySmelt='none',
    place='none', equip='none')
BASIC_ACTIONS = {
    'noop': {}, 'attack': dict(attack=1),
    'turn_up': dict(camera=(-15, 0)), 'turn_down': dict(camera=(15, 0)),
    'turn_left': dict(camera=(0, -15)), 'turn_right': dict(camera=(0, 15)),
    'forward': dict(forward=1), 'back': dict(back=1),
    'left': dict(left=1), 'right': dict(right=1),
    'jump': dict(jump=1, forward=1), 'place_dirt': dict(place='dirt'),
}
DIAMOND_ACTIONS = {
    **BASIC_ACTIONS,
    'craft_planks': dict(craft='planks'),
    'craft_stick': dict(craft='stick'),
    'craft_crafting_table': dict(craft='crafting_table'),
    'place_crafting_table': dict(place='crafting_table'),
    'craft_wooden_pickaxe': dict(nearbyCraft='wooden_pickaxe'),
    'craft_stone_pickaxe': dict(nearbyCraft='stone_pickaxe'),
    'craft_iron_pickaxe': dict(nearbyCraft='iron_pickaxe'),
    'equip_stone_pickaxe': dict(equip='stone_pickaxe'),
    'equip_wooden_pickaxe': dict(equip='wooden_pickaxe'),
    'equip_iron_pickaxe': dict(equip='iron_pickaxe'),
    'craft_furnace': dict(nearbyCraft='furnace'),
    'place_furnace': dict(place='furnace'),
    'smelt_iron_ingot': dict(nearbySmelt='iron_ingot'),
}
# The items whose first collection the diamond task rewards, in order.
DIAMOND_ITEMS = (
    'log', 'planks', 'stick', 'crafting_table', 'wooden_pickaxe',
    'cobblestone', 'stone_pickaxe', 'iron_ore', 'furnace', 'iron_ingot',
    'iron_pickaxe', 'diamond')
TASKS = ('wood', 'climb', 'diamond')


class Minecraft(base.Wrapper):
    """A Minecraft task: `wood` rewards each log collected, `diamond` the
    first of each item on the way to a diamond, `climb` the height gained;
    all add 0.01 per health point gained (and subtract it per point lost).
    An episode ends after `length` steps. Keywords go to `MinecraftBase`.
    """

    def __init__(self, task, *args, length=36000, **kwargs):
        checks_task(task)
        actions = DIAMOND_ACTIONS if task == 'diamond' else BASIC_ACTIONS
        env = MinecraftBase(actions, *args, task=task, **kwargs)
        self.base = env
        super().__init__(wrappers.TimeLimit(env, length))
        self.rewards = {
            'wood': lambda: [Collect('log', repeated=1), Health()],
            'climb': lambda: [Climb(), Health()],
            'diamond': lambda: [
                *[Collect(item, once=1) for item in DIAMOND_ITEMS], Health()],
        }[task]()

    def step(self, action):
        obs = self.env.step(action)
        inventory = self.base.inventory
        obs['reward'] = np.float32(
            sum(fn(obs, inventory) for fn in self.rewards))
        return obs


def checks_task(task):
    if task not in TASKS:
        raise ValueError(
            f"Unknown Minecraft task '{task}': choose one of "
            f"{', '.join(f'minecraft_{t}' for t in TASKS)}.")


class Collect:
    """`repeated` per item gained, and `once` for the episode's first."""

    def __init__(self, item, once=0, repeated=0):
        self.item, self.once, self.repeated = item, once, repeated
        self.previous = self.maximum = 0

    def __call__(self, obs, inventory):
        current = inventory[self.item]
        if obs['is_first']:
            self.previous = self.maximum = current
            return 0.0
        reward = self.repeated * max(0, current - self.previous)
        if self.maximum == 0 and current > 0:
            reward += self.once
        self.previous = current
        self.maximum = max(self.maximum, current)
        return reward


class Health:
    """`scale` per health point gained since the last step."""

    def __init__(self, scale=0.01):
        self.scale, self.previous = scale, None

    def __call__(self, obs, inventory=None):
        health = obs['health']
        if obs['is_first']:
            self.previous = health
            return 0.0
        reward = self.scale * (health - self.previous)
        self.previous = health
        return float(reward)


class Climb:
    """The height gained since the last step."""

    def __init__(self):
        self.previous = None

    def __call__(self, obs, inventory=None):
        height = float(obs['log/player_pos'][1])
        if obs['is_first']:
            self.previous = height
        reward, self.previous = height - self.previous, height
        return reward


class MinecraftBase(base.Env):
    """MineRL with a discrete action set (`actions`: name -> MineRL action
    keys) and the original's observations: `image`, the `inventory` counts
    and their episode maximum `inventory_max`, the one-hot `equipped` item,
    `health`, `hunger`, `breath` (scaled to [0, 1]) and `log/<item>` counts
    of `log_inv_keys`. `repeat` repeats movement and attack; `sticky_attack`
    and `sticky_jump` hold those for that many steps (attack only with a
    `break_speed` of 1); `pitch_limit` bounds looking up and down. The
    climb task also observes `log/player_pos`. `make` builds the MineRL
    gym env (tests pass a stand-in).
    """

    LOCK = threading.Lock()  # MineRL's launches are not thread-safe.

    def __init__(
            self, actions, repeat=1, size=(64, 64), break_speed=100.0,
            sticky_attack=30, sticky_jump=10, pitch_limit=(-60, 60),
            log_inv_keys=('log', 'cobblestone', 'iron_ingot', 'diamond'),
            logs=False, task='', make=None):
        if make is None:
            packages.need('minerl', f'minecraft_{task}', 'minecraft',
                          how=HOW)
            from embodied.envs import minecraft_minerl
            make = minecraft_minerl.make
        if logs:
            import logging
            logging.basicConfig(level=logging.DEBUG)
        self._repeat = int(repeat)
        self._size = tuple(int(x) for x in size)
        self._position = task == 'climb'
        with self.LOCK:
            self._env = make(self._size, break_speed)
        spaces = self._env.observation_space
        self._inv_keys = [
            k for k in spaces['inventory'].spaces if k != 'log2']
        self._log_keys = tuple(log_inv_keys)
        self._equip = list(spaces['equipped_items']['mainhand']['type'].values)
        self._names = tuple(actions)
        self._actions = tuple({**NOOP, **a} for a in actions.values())
        self._sticky = dict(
            attack=0 if break_speed != 1.0 else sticky_attack,
            jump=sticky_jump)
        self._pitch_limit = pitch_limit
        self._reset_state()
        self._done = True

    @property
    def obs_space(self):
        n = len(self._inv_keys)
        spaces = {
            'image': elements.Space(np.uint8, self._size + (3,)),
            'inventory': elements.Space(np.float32, (n,), 0),
            'inventory_max': elements.Space(np.float32, (n,), 0),
            'equipped': elements.Space(
                np.float32, (len(self._equip),), 0, 1),
            'health': elements.Space(np.float32),
            'hunger': elements.Space(np.float32),
            'breath': elements.Space(np.float32),
            **base.step_spaces(),
            **{f'log/{k}': elements.Space(np.int64) for k in self._log_keys},
        }
        if self._position:
            spaces['log/player_pos'] = elements.Space(np.float32, (3,))
        return spaces

    @property
    def act_space(self):
        return base.discrete_act_space(len(self._actions))

    @property
    def inventory(self):
        """The last observation's item counts by name."""
        return self._inventory

    def step(self, action):
        if action['reset'] or self._done:
            return self._reset()
        act = self._sticky_actions(dict(self._actions[int(action['action'])]))
        follow = {**NOOP, **{k: act[k] for k in (
            'attack', 'forward', 'back', 'left', 'right')}}
        for each in [act] + [follow] * (self._repeat - 1):
            raw, _, done, info = self._env.step(each)
            if 'error' in info:
                return self._reset()
            if done:
                break
        self._done = bool(done)
        return self._obs(raw, is_last=self._done)

    def close(self):
        try:
            self._env.close()
        except Exception:
            pass

    def _reset(self):
        with self.LOCK:
            raw = self._env.reset()
        self._reset_state()
        self._done = False
        return self._obs(raw, is_first=True)

    def _reset_state(self):
        self._inventory = {}
        self._max_inventory = None
        self._counters = dict(attack=0, jump=0)
        self._pitch = 0

    def _sticky_actions(self, act):
        if self._sticky['attack']:
            if act['attack']:
                self._counters['attack'] = self._sticky['attack']
            if self._counters['attack'] > 0:
                act.update(attack=1, jump=0)
                self._counters['attack'] -= 1
        if self._sticky['jump']:
            if act['jump']:
                self._counters['jump'] = self._sticky['jump']
            if self._counters['jump'] > 0:
                act.update(jump=1, forward=1)
                self._counters['jump'] -= 1
        pitch = act['camera'][0]
        if self._pitch_limit and pitch:
            low, high = self._pitch_limit
            if not low <= self._pitch + pitch <= high:
                act['camera'] = (0, act['camera'][1])
            self._pitch += act['camera'][0]
        return act

    def _obs(self, raw, is_first=False, is_last=False):
        counts = dict(raw['inventory'])
        counts['log'] = counts['log'] + counts.pop('log2', 0)
        self._inventory = {k: counts[k] for k in self._inv_keys if k != 'air'}
        inventory = np.array(
            [counts[k] for k in self._inv_keys], np.float32)
        self._max_inventory = inventory if self._max_inventory is None else (
            np.maximum(self._max_inventory, inventory))
        equipped = np.zeros(len(self._equip), np.float32)
        equipped[self._equip.index(
            raw['equipped_items']['mainhand']['type'])] = 1.0
        life = raw['life_stats']
        obs = {
            'image': np.asarray(raw['pov'], np.uint8),
            'inventory': inventory,
            'inventory_max': self._max_inventory.copy(),
            'equipped': equipped,
            'health': np.float32(life['life'] / 20),
            'hunger': np.float32(life['food'] / 20),
            'breath': np.float32(life['air'] / 300),
            'reward': np.float32(0.0),
            'is_first': np.bool_(is_first),
            'is_last': np.bool_(is_last),
            'is_terminal': np.bool_(is_last),
            **{f'log/{k}': np.int64(counts[k]) for k in self._log_keys},
        }
        if self._position:
            stats = raw['location_stats']
            obs['log/player_pos'] = np.array(
                [stats['xpos'], stats['ypos'], stats['zpos']], np.float32)
        return obs
