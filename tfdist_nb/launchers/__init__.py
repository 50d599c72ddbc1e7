"""Where tasks run. One small interface (:mod:`.base`); backends registered by short name."""

from tfdist_nb.launchers.base import Launcher, TaskHandle, TaskLaunch, available, get_launcher

__all__ = ["Launcher", "TaskHandle", "TaskLaunch", "available", "get_launcher"]
