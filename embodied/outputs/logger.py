"""The run's logger: elements' Logger that also closes its outputs."""

import elements


class Logger(elements.Logger):
    """`elements.Logger` whose `close` (after writing what is left) also
    closes each output that has a `close`: the W&B run finishes and sends
    its last rows, TensorBoard's event file is closed. Closing twice closes
    once. An output that fails to close is named on stdout, and the others
    still close."""

    _closed = False

    def close(self):
        if self._closed:
            return
        self._closed = True
        super().close()
        for output in self.outputs:
            close = getattr(output, 'close', None)
            if not close:
                continue
            try:
                close()
            except Exception as e:
                print(f'Error closing the logger output '
                      f'{type(output).__name__}: {e}', flush=True)
