/**
 * ``tfdist:open-console``: a JupyterLab console on one task's kernel while its cluster runs
 * (docs/reference.md, Consoles on a task). The server registers the task's kernel with its own
 * kernel manager; JupyterLab's console, and its debugger, then open on that kernel id. Args:
 * ``cluster`` (default: the newest live one) and ``task`` (default: asked).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { InputDialog, showErrorMessage } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { IClusterSummary, openTaskKernel, requestAPI } from './api';

export const CONSOLE_COMMAND = 'tfdist:open-console';

async function pick(cluster: string | undefined): Promise<[string, string] | null> {
  const clusters = await requestAPI<IClusterSummary[]>();
  const found = clusters.find(c => (cluster ? c.id === cluster : c.state === 'live'));
  const tasks = (found?.tasks ?? []).filter(t => t.console).map(t => t.task);
  if (!found || !tasks.length) {
    await showErrorMessage('tfdist console', 'no live tfdist_nb cluster with a task to open a console on');
    return null;
  }
  const chosen = await InputDialog.getItem({ title: `Console on a task of ${found.id}`, items: tasks });
  return chosen.button.accept && chosen.value ? [found.id, chosen.value] : null;
}

export function addConsoleCommand(app: JupyterFrontEnd, icon: LabIcon): void {
  app.commands.addCommand(CONSOLE_COMMAND, {
    label: args => (args.task ? `Console on ${args.task}` : 'Open a console on a tfdist task'),
    caption: "A JupyterLab console, with JupyterLab's debugger, on a task of a running tfdist_nb cluster",
    icon,
    execute: async args => {
      let cluster = args.cluster as string | undefined;
      let task = args.task as string | undefined;
      if (!cluster || !task) {
        const picked = await pick(cluster);
        if (!picked) {
          return null;
        }
        [cluster, task] = picked;
      }
      let kernelId: string;
      try {
        kernelId = (await openTaskKernel(cluster, task)).kernel_id;
      } catch (err) {
        await showErrorMessage(`tfdist console on ${task}`, (err as Error).message);
        return null;
      }
      return app.commands.execute('console:create', {
        path: `tfdist/${cluster}/${task}`,
        name: `tfdist ${task}`,
        kernelPreference: { id: kernelId },
        insertMode: 'split-bottom',
        activate: true
      });
    }
  });
}
