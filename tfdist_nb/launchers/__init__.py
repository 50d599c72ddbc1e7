"""Where tasks run. One small interface (:mod:`.base`); backends found by short name
(:mod:`.registry`)."""

from tfdist_nb.launchers.base import Launcher, StopPath, StopReport, TaskHandle, TaskLaunch
from tfdist_nb.launchers.registry import available, get_launcher, register

__all__ = ["Launcher", "StopPath", "StopReport", "TaskHandle", "TaskLaunch", "available",
           "get_launcher", "register"]
