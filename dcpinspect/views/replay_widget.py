"""The replay's notebook widget: a thin ipywidgets view over :class:`~dcpinspect.views.replay_view.ReplayModel`.

It does not import :mod:`.replay_view` (which makes it on demand): the model is read by its names.

1. The widget holds no state: three HTML panes (the script line and counts,
   the connections table, the divergences table) are redrawn from the model
   whenever it tells of a change; the model's timer does the refreshing.
2. Its mime bundle carries the model's ``_repr_html_`` and ``text()``, so a
   notebook without a front end (nbconvert, a terminal) shows the same tables.
3. Closing the widget stops the model's timer.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w

__all__ = ["ReplayView"]


class ReplayView(w.VBox):
    """The replay's script, connections and divergences, mirrored from a ``ReplayModel``."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.header = w.HTML()
        self.connections = w.HTML()
        self.divergences = w.HTML()
        super().__init__([self.header, w.HTML("<h4>Connections</h4>"), self.connections, w.HTML("<h4>Divergences</h4>"), self.divergences])
        self.redraw()
        model.on_change(lambda _what: self.redraw())

    def redraw(self) -> None:
        """Show what the model holds now."""
        m = self.model
        self.header.value = m.header_html()
        self.connections.value = m.connections_html()
        self.divergences.value = m.divergences_html()

    def close(self) -> None:
        """Close the widget and stop the model's refreshes."""
        self.model.stop()
        super().close()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/html"] = self.model._repr_html_()
        bundle["text/plain"] = self.model.text()
        return bundle
