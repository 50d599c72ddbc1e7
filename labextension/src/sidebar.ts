/**
 * The "tfdist" sidebar: every cluster the server finds in its run directories, newest first.
 * A click opens (or brings forward) the cluster's dashboard pane.
 */
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IClusterSummary, requestAPI } from './api';

const POLL_MS = 2000;

export class ClusterSidebar extends Widget {
  private _list: HTMLUListElement;
  private _status: HTMLElement;
  private _timer: number | null = null;
  private _busy = false;

  constructor(private readonly _commands: CommandRegistry, private readonly _command: string) {
    super();
    this.addClass('tfdist-lab-sidebar');
    const head = document.createElement('div');
    head.className = 'tfdist-lab-sidebar-head';
    const title = document.createElement('span');
    title.textContent = 'tfdist clusters';
    const refresh = document.createElement('button');
    refresh.className = 'jp-Button tfdist-lab-refresh';
    refresh.textContent = 'refresh';
    refresh.onclick = () => void this.refresh();
    head.append(title, refresh);
    this._status = document.createElement('div');
    this._status.className = 'tfdist-lab-sidebar-status';
    this._list = document.createElement('ul');
    this._list.className = 'tfdist-lab-clusters';
    this.node.append(head, this._status, this._list);
  }

  async refresh(): Promise<void> {
    if (this._busy) {
      return;
    }
    this._busy = true;
    try {
      this._show(await requestAPI<IClusterSummary[]>());
    } catch (err) {
      this._status.textContent = `tfdist server extension not reachable: ${(err as Error).message}`;
    } finally {
      this._busy = false;
    }
  }

  dispose(): void {
    this._stop();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
    this._stop();
    this._timer = window.setInterval(() => {
      if (this.isVisible) {
        void this.refresh();
      }
    }, POLL_MS);
  }

  protected onAfterHide(msg: Message): void {
    this._stop();
  }

  private _stop(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private _show(clusters: IClusterSummary[]): void {
    const live = clusters.filter(c => c.state === 'live').length;
    this._status.textContent = clusters.length
      ? `${clusters.length} cluster(s), ${live} live`
      : 'no clusters yet: start one with %%tfcluster';
    this._list.textContent = '';
    for (const c of clusters) {
      const item = document.createElement('li');
      item.className = 'tfdist-lab-cluster';
      item.dataset.cluster = c.id;
      item.dataset.state = c.state;
      item.title = `${c.run_dir}\nclick: open the dashboard`;
      const top = document.createElement('div');
      const id = document.createElement('span');
      id.className = 'tfdist-lab-cluster-id';
      id.textContent = c.id;
      const state = document.createElement('span');
      state.className = 'tfdist-lab-state';
      state.dataset.state = c.state;
      state.textContent = c.state;
      top.append(id, state);
      if (c.alerts) {
        const alerts = document.createElement('span');
        alerts.className = 'tfdist-lab-alert-count';
        alerts.textContent = `${c.alerts} alert(s)`;
        top.append(alerts);
      }
      const spec = document.createElement('div');
      spec.className = 'tfdist-lab-cluster-spec';
      spec.textContent = c.spec;
      const tasks = document.createElement('div');
      tasks.className = 'tfdist-lab-cluster-tasks';
      tasks.textContent = c.tasks
        .map(t => `${t.task} ${t.state}${t.step ? ` @${t.step}` : ''}`)
        .join(' · ');
      item.append(top, spec, tasks);
      item.onclick = () => void this._commands.execute(this._command, { id: c.id });
      this._list.appendChild(item);
    }
  }
}
