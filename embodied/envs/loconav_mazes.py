"""The LocoNav maze arenas: fixed layouts of coloured walls on dm_control's
locomotion maze arena, with the spawn `P` and the goal `G`.

In a layout, a digit is a wall of that colour (matplotlib's tab10 colours
1 to 9), `*` a grey wall, `.` floor and a space open ground outside the
walls (floor too: the walls close the maze off from it).
"""

MAPS = {
    'maze_s': (
        '      66666',
        '      6...6',
        '      6.G.6',
        '      6...6',
        '      5...4',
        '      5...4',
        '1111555...4',
        '1.........3',
        '1.P.......3',
        '1.........3',
        '11112223333',
    ),
    'maze_m': (
        '66668887777',
        '6.........7',
        '6.G.......7',
        '6.........7',
        '6665555...4',
        '      5...4',
        '1111555...4',
        '1.........3',
        '1.P.......3',
        '1.........3',
        '11112223333',
    ),
    'maze_l': (
        '88887776666...',
        '8.........6...',
        '8.G.......6...',
        '8.........6555',
        '8888777......5',
        '......7......5',
        '11111.7......5',
        '1...1.7999...5',
        '1...1....9...5',
        '1...111999...5',
        '2............4',
        '2....P.......4',
        '2............4',
        '22223333334444',
    ),
    'maze_xl': (
        '99999998888.44444',
        '9.........8.4...4',
        '9.......G.8.4...4',
        '9.........8.4...4',
        '6...7778888.5...3',
        '6...7.......5...3',
        '6...777555555...3',
        '5...............3',
        '5...............3',
        '5...............3',
        '5555444...666...3',
        '......4...6.6...3',
        '1111444...6.6...3',
        '1.........2.1...1',
        '1.P.......2.1...1',
        '1.........2.1...1',
        '11111112222.11111',
    ),
    'maze_xxl': (
        '7777***666***9999',
        '7...............9',
        '7.............G.9',
        '7...............9',
        '*...555******9999',
        '*...5............',
        '*...555******3333',
        '8...............3',
        '8...............3',
        '8...............3',
        '8888******444...*',
        '............4...*',
        '1111******444...*',
        '1...............2',
        '1.P.............2',
        '1...............2',
        '1111***666***2222',
    ),
    'empty': ('.' * 17,) * 17,
}

GREY = (0.8, 0.8, 0.8)
TAB10 = tuple(  # matplotlib's tab10 colours 1 to 9, as RGB in [0, 1].
    tuple(int(code[i:i + 2], 16) / 255 for i in (0, 2, 4)) for code in (
        '1f77b4', 'ff7f0e', '2ca02c', 'd62728', '9467bd', '8c564b',
        'e377c2', '7f7f7f', 'bcbd22'))

def entity_layer(name):
    """The labmaze entity layer of a map: floor and open ground as spaces."""
    return ''.join(row.replace('.', ' ') + '\n' for row in MAPS[name])


def arena(name, random_state=None):
    """dm_control's MazeWithTargets over the map `name`, its walls
    coloured by their digits, 1.2 m per cell and 2 m high."""
    import labmaze
    from dm_control.locomotion.arenas import mazes
    maze = labmaze.FixedMazeWithRandomGoals(
        entity_layer=entity_layer(name), num_spawns=1, num_objects=1,
        random_state=random_state)
    textures = {'*': _flat_wall('grey', GREY)}
    for index, color in enumerate(TAB10):
        textures[str(index + 1)] = _flat_wall(f'color{index + 1}', color)
    return mazes.MazeWithTargets(
        maze, xy_scale=1.2, z_height=2.0, aesthetic='default',
        wall_textures=textures, name='maze')


def _flat_wall(name, color):
    """A wall texture provider with one flat colour."""
    from dm_control import composer
    from dm_control import mjcf

    class FlatWall(composer.Entity):

        def _build(self):
            self._mjcf_root = mjcf.RootElement(model=f'wall_{name}')
            self._textures = [self._mjcf_root.asset.add(
                'texture', type='2d', name='wall', builtin='flat',
                rgb1=color, width=100, height=100)]

        @property
        def mjcf_model(self):
            return self._mjcf_root

        @property
        def textures(self):
            return self._textures

    return FlatWall()
