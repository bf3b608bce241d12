"""The LocoNav quadruped: dm_control's suite quadruped as a locomotion
walker (the body without the suite's floor, walls, terrain and ball), with
two cameras in front of the others: `sideon` and `float_far`."""

import os

import numpy as np
from dm_control import composer
from dm_control import mjcf
from dm_control import suite
from dm_control.composer.observation import observable
from dm_control.locomotion.walkers import base
from dm_control.locomotion.walkers import legacy_base

# What the suite's quadruped.xml has besides the walker, by element type.
ARENA_PARTS = {
    'geom': ('floor', 'wall_px', 'wall_py', 'wall_nx', 'wall_ny', 'terrain'),
    'site': ('target',),
    'camera': ('global',),
    'body': ('ball',),
    'hfield': ('terrain',),
    'material': ('ball',),
    'texture': ('ball',),
}
FEET = ('toe_front_left', 'toe_front_right', 'toe_back_right',
        'toe_back_left')


def walker_model():
    """The suite's quadruped model as a walker: no arena, no root joint
    (composer attaches a free one), no skybox, headlight or clipping
    planes (the arena's apply)."""
    path = os.path.join(os.path.dirname(suite.__file__), 'quadruped.xml')
    root = mjcf.from_path(path)
    for kind, names in ARENA_PARTS.items():
        for name in names:
            element = root.find(kind, name)
            if element is not None:
                element.remove()
    for texture in root.asset.find_all('texture'):
        if texture.type == 'skybox':
            texture.remove()
    root.find('joint', 'root').remove()  # The suite's <freejoint>.
    # The suite's lighting and clipping are the arena's to set.
    for name in ('ambient', 'diffuse', 'specular'):
        setattr(root.visual.headlight, name, None)
    root.visual.map.znear = None
    root.visual.map.zfar = None
    cameras = [
        dict(name='sideon', pos=(0, -10, 5), fovy=45, mode='targetbody',
             target='torso'),
        dict(name='float_far', pos=(-4, 0, 2), xyaxes=(0, -1, 0, .5, 0, 1),
             mode='trackcom', fovy=90)]
    for camera in reversed(cameras):
        root.worldbody.insert('camera', 0, **camera)
    return root


class Quadruped(legacy_base.Walker):
    """The suite's quadruped, walking in a composer arena."""

    def _build(self, name='walker', initializer=None):
        super()._build(initializer=initializer)
        self._mjcf_root = walker_model()
        if name:
            self._mjcf_root.model = name
        self._prev_action = np.zeros(
            self.action_spec.shape, self.action_spec.dtype)

    def initialize_episode(self, physics, random_state):
        self._prev_action = np.zeros_like(self._prev_action)

    def apply_action(self, physics, action, random_state):
        super().apply_action(physics, action, random_state)
        self._prev_action[:] = action

    def _build_observables(self):
        return QuadrupedObservables(self)

    @property
    def mjcf_model(self):
        return self._mjcf_root

    @property
    def upright_pose(self):
        return base.WalkerPose()

    @composer.cached_property
    def actuators(self):
        return self._mjcf_root.find_all('actuator')

    @composer.cached_property
    def root_body(self):
        return self._mjcf_root.find('body', 'torso')

    @composer.cached_property
    def bodies(self):
        return tuple(self._mjcf_root.find_all('body'))

    @composer.cached_property
    def mocap_tracking_bodies(self):
        return tuple(self._mjcf_root.find_all('body'))

    @property
    def mocap_joints(self):
        return self._mjcf_root.find_all('joint')

    @composer.cached_property
    def end_effectors(self):
        return tuple(self._mjcf_root.find('body', name) for name in FEET)

    @composer.cached_property
    def observable_joints(self):
        return self._mjcf_root.find_all('joint')

    @composer.cached_property
    def egocentric_camera(self):
        return self._mjcf_root.find('camera', 'egocentric')

    @composer.cached_property
    def ground_contact_geoms(self):
        return tuple(
            geom for foot in self.end_effectors
            for geom in foot.find_all('geom'))

    def aliveness(self, physics):
        """1 upright, down to -1 upside down (the torso's z axis)."""
        return (physics.bind(self.root_body).xmat[-1] - 1.0) / 2.0

    @property
    def prev_action(self):
        return self._prev_action


class QuadrupedObservables(legacy_base.WalkerObservables):
    """The legacy walker's observables plus the actuator activations and
    the global positions of the root and the torso."""

    @composer.observable
    def actuator_activations(self):
        return observable.Generic(lambda physics: physics.data.act)

    @composer.observable
    def root_global_pos(self):
        return observable.Generic(lambda physics: np.reshape(
            self._entity.get_pose(physics)[0], -1))

    @composer.observable
    def torso_global_pos(self):
        return observable.Generic(lambda physics: np.reshape(
            physics.bind(self._entity.root_body).xpos, -1))

    @property
    def proprioception(self):
        return [
            self.joints_pos, self.joints_vel, self.actuator_activations,
            self.sensors_accelerometer, self.sensors_gyro,
            self.sensors_velocimeter, self.sensors_force,
            self.sensors_torque, self.world_zaxis, self.root_global_pos,
            self.torso_global_pos,
        ] + self._collect_from_attachments('proprioception')
