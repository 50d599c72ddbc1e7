/**
 * tfdist-nb: JupyterLab panes over tfdist_nb's run directories (docs/reference.md, JupyterLab
 * panes). A "tfdist" sidebar lists the clusters the server sees; ``tfdist:open-dashboard``
 * opens one dockable pane per cluster, restored by the layout restorer after a reload;
 * ``tfdist:open-console`` (and each task's button in a pane) a console on a task's kernel.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { LabIcon } from '@jupyterlab/ui-components';

import { IClusterSummary, requestAPI } from './api';
import { CONSOLE_COMMAND, addConsoleCommand } from './console';
import { openerFactory } from './opener';
import { ClusterPanel } from './panel';
import { ClusterSidebar } from './sidebar';

export const COMMAND = 'tfdist:open-dashboard';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">
<g class="jp-icon3" fill="#616161">
<circle cx="12" cy="5" r="3"/><circle cx="5" cy="18" r="3"/><circle cx="19" cy="18" r="3"/>
<path d="M11 7.5h2v3.2l4.6 4.8-1.4 1.4L12 12.6l-4.2 4.3-1.4-1.4L11 10.7z"/></g></svg>`;

export const tfdistIcon = new LabIcon({ name: 'tfdist-nb:icon', svgstr: ICON_SVG });

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'tfdist-nb:plugin',
  description: 'Dockable tfdist_nb cluster dashboards fed by the Jupyter server',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, IRenderMimeRegistry],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    rendermime: IRenderMimeRegistry | null
  ) => {
    const tracker = new WidgetTracker<MainAreaWidget<ClusterPanel>>({ namespace: 'tfdist' });

    app.commands.addCommand(COMMAND, {
      label: args => (args.id ? `tfdist dashboard ${args.id}` : 'Open tfdist dashboard'),
      caption: 'Open the dockable dashboard of a tfdist_nb cluster (newest live one by default)',
      icon: tfdistIcon,
      execute: async args => {
        let id = args.id as string | undefined;
        if (!id) {
          const clusters = await requestAPI<IClusterSummary[]>();
          id = (clusters.find(c => c.state === 'live') ?? clusters[0])?.id;
          if (!id) {
            console.warn('tfdist: no cluster found in the run directories');
            return null;
          }
        }
        const existing = tracker.find(w => w.content.clusterId === id);
        if (existing) {
          app.shell.activateById(existing.id);
          return existing;
        }
        const cluster = id;
        const content = new ClusterPanel(
          cluster,
          task => void app.commands.execute(CONSOLE_COMMAND, { cluster, task })
        );
        const widget = new MainAreaWidget({ content });
        widget.id = `tfdist-dashboard-${id}`;
        widget.title.label = content.title.label;
        widget.title.icon = tfdistIcon;
        widget.title.closable = true;
        content.title.changed.connect(() => {
          widget.title.label = content.title.label;
        });
        void tracker.add(widget);
        if (!widget.isAttached) {
          app.shell.add(widget, 'main');
        }
        app.shell.activateById(widget.id);
        return widget;
      }
    });
    palette?.addItem({ command: COMMAND, category: 'tfdist' });
    addConsoleCommand(app, tfdistIcon);
    palette?.addItem({ command: CONSOLE_COMMAND, category: 'tfdist' });

    const sidebar = new ClusterSidebar(app.commands, COMMAND);
    sidebar.id = 'tfdist-sidebar';
    sidebar.title.icon = tfdistIcon;
    sidebar.title.caption = 'tfdist clusters';
    app.shell.add(sidebar, 'left', { rank: 650 });

    if (restorer) {
      restorer.add(sidebar, 'tfdist-sidebar');
      void restorer.restore(tracker, {
        command: COMMAND,
        args: w => ({ id: w.content.clusterId }),
        name: w => w.content.clusterId
      });
    }
    rendermime?.addFactory(openerFactory(app.commands, COMMAND), 10);
  }
};

export default plugin;
