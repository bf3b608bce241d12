def train_eval(*args):
    raise NotImplementedError
