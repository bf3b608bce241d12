"""The MineRL environment the Minecraft tasks play in: a flat-world survival
spec with every item in the inventory observation, a break-speed
multiplier, and the keyboard, camera, craft, smelt, place and equip
actions. Imported only when a Minecraft env is built (needs minerl 0.4.4
and a Java 8 JDK)."""

import sys
import types

import numpy as np


def numpy_with_aliases():
    """numpy as minerl 0.4.4's modules expect it: with the aliases
    np.int, np.float and np.bool that numpy 1.24 removed. Given to those
    modules alone; numpy itself is unchanged."""
    module = types.ModuleType('numpy_with_aliases')
    module.__dict__.update(np.__dict__)
    module.int, module.float, module.bool = int, float, bool
    return module


def adapt_minerl():
    """Points minerl's modules that use the removed aliases at
    `numpy_with_aliases()`."""
    import minerl.herobraine.hero.handlers  # noqa: F401 (loads the modules)
    aliased = numpy_with_aliases()
    for name, module in list(sys.modules.items()):
        if name.startswith('minerl.') and getattr(module, 'np', None) is np:
            module.np = aliased


def make(resolution=(64, 64), break_speed=100.0):
    """The MineRL gym environment (old gym API: reset() -> obs, step() ->
    obs, reward, done, info), with `resolution` (height, width) frames."""
    adapt_minerl()
    from minerl.herobraine.env_spec import EnvSpec
    from minerl.herobraine.hero import handlers

    class Spec(EnvSpec):

        def create_agent_start(self):
            return [break_speed_handler(break_speed)]

        def create_server_world_generators(self):
            return [handlers.DefaultWorldGenerator(force_reset=True)]

        def create_server_quit_producers(self):
            return [handlers.ServerQuitWhenAnyAgentFinishes()]

        def create_server_initial_conditions(self):
            return [
                handlers.TimeInitialCondition(
                    allow_passage_of_time=True, start_time=0),
                handlers.SpawningInitialCondition(allow_spawning=True)]

        def create_observables(self):
            return observables(resolution)

        def create_actionables(self):
            return actionables()

        def is_from_folder(self, folder):
            return folder == 'none'

        def get_docstring(self):
            return ''

        def determine_success_from_rewards(self, rewards):
            return True

    for name in EMPTY:
        setattr(Spec, name, lambda self: [])
    return Spec(name='MineRLEnv-v1').make()


# The spec's parts this world has none of.
EMPTY = (
    'create_agent_handlers', 'create_rewardables', 'create_server_decorators',
    'create_mission_handlers', 'create_monitors')


def observables(resolution):
    """Frames, every item's count, the held item, position and life."""
    from minerl.herobraine.hero import handlers
    from minerl.herobraine.hero import mc
    return [
        handlers.POVObservation(tuple(resolution)),
        handlers.FlatInventoryObservation(mc.ALL_ITEMS),
        handlers.EquippedItemObservation(
            mc.ALL_ITEMS, _default='air', _other='other'),
        handlers.ObservationFromCurrentLocation(),
        handlers.ObservationFromLifeStats()]


def actionables():
    """The movement keys, the camera, and placing, equipping, crafting and
    smelting any item."""
    from minerl.herobraine.hero import handlers
    from minerl.herobraine.hero import mc
    from minerl.herobraine.hero.mc import INVERSE_KEYMAP
    items = ['none'] + mc.ALL_ITEMS
    kw = dict(_other='none', _default='none')
    keys = [handlers.KeybasedCommandAction(k, INVERSE_KEYMAP[k]) for k in (
        'forward', 'back', 'left', 'right', 'jump', 'sneak', 'attack')]
    return keys + [
        handlers.CameraAction(),
        handlers.PlaceBlock(items, **kw),
        handlers.EquipAction(items, **kw),
        handlers.CraftAction(items, **kw),
        handlers.CraftNearbyAction(items, **kw),
        handlers.SmeltItemNearby(items, **kw)]


def break_speed_handler(multiplier):
    """The agent-start handler that breaks blocks `multiplier` times as
    fast as normal."""
    from minerl.herobraine.hero import handler

    class BreakSpeed(handler.Handler):

        def __init__(self, multiplier):
            self.multiplier = multiplier

        def to_string(self):
            return f'break_speed({self.multiplier})'

        def xml_template(self):
            return '<BreakSpeedMultiplier>{{multiplier}}</BreakSpeedMultiplier>'

    return BreakSpeed(multiplier)
