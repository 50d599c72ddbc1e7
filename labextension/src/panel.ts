/**
 * The dockable dashboard of one cluster (class ``tfdist-lab-panel``), fed by the server's
 * websocket: per-task rows, alerts, a filtered log tail and charts. It reconnects while the
 * cluster is live and turns read-only once the cluster is finished or orphaned.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  IClusterDetail,
  IClusterSummary,
  ILatest,
  ILogLine,
  ISeries,
  Num,
  StreamMessage,
  isLive,
  requestAPI,
  streamUrl
} from './api';
import { ILine, PALETTE, drawChart } from './charts';

const LOGS_KEPT = 2000;
const LOGS_SHOWN = 300;
const SAMPLES_KEPT = 600;
const STEPS_KEPT = 1000;
const RENDER_EVERY_MS = 400;

interface IChartDef {
  key: string;
  title: string;
  xIsTime: boolean;
  points: (s: ISeries) => [number, number][];
  /** the y axis reaches at least this (from the cluster's detail), e.g. the straggler threshold */
  floor?: (d: IClusterDetail | null) => number;
}

function pairs(rows: Num[][], xi: number, yi: number): [number, number][] {
  const out: [number, number][] = [];
  for (const r of rows) {
    const x = r[xi];
    const y = r[yi];
    if (typeof x === 'number' && typeof y === 'number') {
      out.push([x, y]);
    }
  }
  return out;
}

const CHARTS: IChartDef[] = [
  { key: 'step_time', title: 'step time (ms) by step', xIsTime: false, points: s => pairs(s.steps, 0, 2) },
  {
    key: 'lateness',
    title: 'lateness (ms) by step; dashed: the straggler threshold',
    xIsTime: false,
    points: s => pairs(s.lateness, 0, 1),
    floor: d => d?.lateness_floor_ms ?? 10
  },
  { key: 'cpu', title: 'CPU (%)', xIsTime: true, points: s => pairs(s.samples, 0, 1) },
  { key: 'rss', title: 'RSS (MB)', xIsTime: true, points: s => pairs(s.samples, 0, 2) },
  { key: 'gpu', title: 'GPU utilisation (%)', xIsTime: true, points: s => pairs(s.samples, 0, 3) }
];

function num(v: Num | undefined, digits = 0, unit = ''): string {
  return typeof v === 'number' && isFinite(v) ? `${v.toFixed(digits)}${unit}` : '';
}

function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** The collective a task waits in and for how long; nothing for one that completes at once. */
function collectiveText(latest: ILatest, now: number): string {
  const since = latest.collective_since;
  if (!latest.collective || since === null || since === undefined) {
    return '';
  }
  const waited = now - since;
  return waited < 0.5 ? '' : `${latest.collective} · ${waited.toFixed(0)} s`;
}

function emptySeries(): ISeries {
  return { samples: [], steps: [], lateness: [], latest: {}, last_output: null };
}

function trim<T>(arr: T[], n: number): void {
  if (arr.length > n) {
    arr.splice(0, arr.length - n);
  }
}

export class ClusterPanel extends Widget {
  readonly clusterId: string;
  private _summary: IClusterSummary | null = null;
  private _detail: IClusterDetail | null = null;
  private _alerts: string[] = [];
  private _logs: ILogLine[] = [];
  private _series = new Map<string, ISeries>();
  private _ws: WebSocket | null = null;
  private _gone = false;
  private _retries = 0;
  private _timer: number | null = null;
  private _error = '';
  private _updates = 0;

  private _header: HTMLElement;
  private _stateBadge: HTMLElement;
  private _note: HTMLElement;
  private _alertsNode: HTMLElement;
  private _rows: HTMLTableSectionElement;
  private _charts: HTMLElement;
  private _chartHosts = new Map<string, HTMLElement>();
  private _chartTitles = new Map<string, HTMLElement>();
  private _legend: HTMLElement;
  private _log: HTMLElement;
  private _taskFilter: HTMLSelectElement;
  private _streamFilter: HTMLSelectElement;
  private _grep: HTMLInputElement;

  /** ``onConsole``: open a console on a task (a button in its row while the cluster runs) */
  constructor(clusterId: string, onConsole?: (task: string) => void) {
    super();
    this.clusterId = clusterId;
    this.addClass('tfdist-lab-panel');
    this.node.dataset.cluster = clusterId;
    this.node.dataset.state = 'connecting';
    this.title.label = `tfdist ${clusterId}`;
    this.title.caption = `tfdist_nb cluster ${clusterId}`;

    const n = this.node;
    this._header = h('div', 'tfdist-lab-header');
    const name = h('span', 'tfdist-lab-id', clusterId);
    this._stateBadge = h('span', 'tfdist-lab-state', 'connecting');
    this._note = h('span', 'tfdist-lab-note');
    this._header.append(name, this._stateBadge, this._note);
    n.appendChild(this._header);

    this._alertsNode = h('ul', 'tfdist-lab-alerts');
    n.appendChild(this._alertsNode);

    const table = h('table', 'tfdist-lab-tasks');
    const head = table.createTHead().insertRow();
    for (const col of [
      'task',
      'state',
      'step',
      'step time',
      'lateness',
      'CPU',
      'RSS',
      'GPUs',
      'GPU',
      'GPU mem',
      'collective',
      'last output'
    ]) {
      head.appendChild(h('th', '', col));
    }
    this._rows = table.createTBody();
    if (onConsole) {
      // one listener for the rows' buttons: the rows are redrawn with every update
      this._rows.addEventListener('click', ev => {
        const button = (ev.target as HTMLElement).closest('.tfdist-lab-console-button');
        const task = button?.closest('tr')?.dataset.task;
        if (task) {
          onConsole(task);
        }
      });
    }
    n.appendChild(table);

    this._legend = h('div', 'tfdist-lab-legend');
    n.appendChild(this._legend);
    this._charts = h('div', 'tfdist-lab-charts');
    for (const def of CHARTS) {
      const box = h('div', 'tfdist-lab-chart');
      box.dataset.chart = def.key;
      const title = h('div', 'tfdist-lab-chart-title', def.title);
      box.appendChild(title);
      this._chartTitles.set(def.key, title);
      const host = h('div', 'tfdist-lab-chart-body');
      box.appendChild(host);
      this._chartHosts.set(def.key, host);
      this._charts.appendChild(box);
    }
    n.appendChild(this._charts);

    const logBox = h('div', 'tfdist-lab-logs');
    const filters = h('div', 'tfdist-lab-filters');
    this._taskFilter = h('select', 'tfdist-lab-filter-task');
    this._taskFilter.appendChild(new Option('all tasks', ''));
    this._streamFilter = h('select', 'tfdist-lab-filter-stream');
    for (const [label, value] of [
      ['all streams', ''],
      ['stdout', 'stdout'],
      ['stderr', 'stderr'],
      ['notes', 'note'],
      ['rich', 'rich']
    ]) {
      this._streamFilter.appendChild(new Option(label, value));
    }
    this._grep = h('input', 'tfdist-lab-filter-grep');
    this._grep.placeholder = 'filter (regex)';
    this._grep.type = 'search';
    for (const control of [this._taskFilter, this._streamFilter, this._grep]) {
      control.addEventListener('input', () => this._renderLogs(true));
      control.addEventListener('change', () => this._renderLogs(true));
    }
    filters.append(this._taskFilter, this._streamFilter, this._grep);
    this._log = h('div', 'tfdist-lab-log');
    logBox.append(filters, this._log);
    n.appendChild(logBox);

    this._connect();
  }

  /** Whether the cluster's controller still runs (the pane is read-only otherwise). */
  get live(): boolean {
    return isLive(this._summary);
  }

  /** Messages received over the websocket (tests and the header show it). */
  get updates(): number {
    return this._updates;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._gone = true;
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
    }
    this._ws?.close();
    this._ws = null;
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    this._schedule();
  }

  // ------------------------------------------------------------------ the stream
  private _connect(): void {
    if (this._gone) {
      return;
    }
    const ws = new WebSocket(streamUrl(this.clusterId));
    this._ws = ws;
    ws.onmessage = ev => {
      this._retries = 0;
      try {
        this._handle(JSON.parse(String(ev.data)) as StreamMessage);
      } catch (err) {
        console.error('tfdist: bad message', err);
      }
    };
    ws.onclose = () => {
      if (this._gone || this._ws !== ws) {
        return;
      }
      this._ws = null;
      if (this._summary !== null && !this.live) {
        return; // finished or orphaned: nothing more will come
      }
      this._retries += 1;
      if (this._retries > 3 && this._summary === null) {
        void this._fallback();
      }
      window.setTimeout(() => this._connect(), Math.min(5000, 500 * 2 ** this._retries));
    };
  }

  /** The websocket does not open (a proxy in the way?): say why from the REST answer. */
  private async _fallback(): Promise<void> {
    try {
      this._applySnapshot(await requestAPI<IClusterDetail>(this.clusterId));
      this._error = '';
    } catch (err) {
      this._error = `cannot reach cluster ${this.clusterId}: ${(err as Error).message}`;
    }
    this._schedule();
  }

  private _handle(msg: StreamMessage): void {
    this._updates += 1;
    if (msg.type === 'snapshot') {
      this._applySnapshot(msg.cluster);
    } else if (msg.type === 'update') {
      this._summary = msg.cluster;
      if (msg.cluster.alert_list) {
        this._alerts = msg.cluster.alert_list;
      }
      for (const line of msg.events) {
        this._logs.push(line);
      }
      trim(this._logs, LOGS_KEPT);
      for (const s of msg.telemetry) {
        const series = this._seriesOf(s.task);
        series.latest = s;
        if (s.ledger_only) {
          continue;
        }
        series.samples.push([
          s.time ?? null,
          s.cpu_percent ?? null,
          s.rss_mb ?? null,
          s.gpu_util_percent ?? null,
          s.gpu_mem_mb ?? null
        ]);
        trim(series.samples, SAMPLES_KEPT);
        for (const row of s.steps) {
          series.steps.push(row);
        }
        trim(series.steps, STEPS_KEPT);
      }
      for (const l of msg.lateness) {
        const series = this._seriesOf(l.task);
        series.lateness.push([l.step, l.lateness_ms]);
        trim(series.lateness, STEPS_KEPT);
      }
      for (const e of msg.events) {
        if (e.stream !== 'note') {
          this._seriesOf(e.task).last_output = e.time;
        }
      }
    }
    this._schedule();
  }

  private _applySnapshot(detail: IClusterDetail): void {
    this._summary = detail;
    this._detail = detail;
    this._alerts = detail.alert_list || [];
    this._logs = (detail.logs || []).slice(-LOGS_KEPT);
    this._series = new Map(Object.entries(detail.series || {}));
  }

  private _seriesOf(task: string): ISeries {
    let s = this._series.get(task);
    if (!s) {
      s = emptySeries();
      this._series.set(task, s);
    }
    return s;
  }

  // ------------------------------------------------------------------ drawing
  private _schedule(): void {
    if (this._timer !== null || this._gone) {
      return;
    }
    this._timer = window.setTimeout(() => {
      this._timer = null;
      if (this.isVisible) {
        this._render();
      }
    }, RENDER_EVERY_MS);
  }

  private _tasks(): string[] {
    const names = new Set<string>();
    for (const t of this._summary?.tasks || []) {
      names.add(t.task);
    }
    for (const name of this._series.keys()) {
      names.add(name);
    }
    return [...names];
  }

  private _render(): void {
    const s = this._summary;
    const state = s ? s.state : this._error ? 'error' : 'connecting';
    this.node.dataset.state = state;
    this.node.classList.toggle('tfdist-lab-readonly', s !== null && !this.live);
    this._stateBadge.textContent = state;
    this._stateBadge.dataset.state = state;
    if (s === null) {
      this._note.textContent = this._error;
      return;
    }
    const readOnly = this.live ? '' : ' · read-only';
    const stopped = s.stopped ? ` at ${new Date(s.stopped * 1000).toLocaleTimeString()}` : '';
    const why =
      s.state === 'finished'
        ? `stopped${stopped}`
        : s.state === 'orphaned'
          ? 'its controller is gone without stopping it'
          : s.state === 'unknown'
            ? 'no state file (an older run)'
            : `controller pid ${s.controller?.pid ?? '?'} on ${s.controller?.host ?? '?'}`;
    this._note.textContent = `${s.spec} · ${why}${readOnly} · ${s.run_dir}`;
    this.title.label = `tfdist ${this.clusterId}${this.live ? '' : ` (${s.state})`}`;
    this._renderAlerts();
    this._renderRows();
    this._renderCharts();
    this._renderLogs(false);
  }

  private _renderAlerts(): void {
    const alerts = this._alerts;
    this._alertsNode.textContent = '';
    this._alertsNode.dataset.count = String(alerts.length);
    const shown = alerts.slice(-10);
    if (alerts.length > shown.length) {
      this._alertsNode.appendChild(
        h('li', 'tfdist-lab-alert tfdist-lab-alert-more', `${alerts.length - shown.length} older alert(s)`)
      );
    }
    for (const text of shown) {
      this._alertsNode.appendChild(h('li', 'tfdist-lab-alert', text));
    }
  }

  private _renderRows(): void {
    const byName = new Map((this._summary?.tasks || []).map(t => [t.task, t]));
    const now = Date.now() / 1000;
    const tasks = this._tasks();
    this._rows.textContent = '';
    tasks.forEach((name, i) => {
      const t = byName.get(name);
      const series = this._series.get(name) || emptySeries();
      const latest = series.latest || {};
      const row = this._rows.insertRow();
      row.className = 'tfdist-lab-task';
      row.dataset.task = name;
      row.dataset.state = t?.state ?? 'unknown';
      if (t?.straggler) {
        row.classList.add('tfdist-lab-straggler');
      }
      const swatch = h('span', 'tfdist-lab-swatch');
      swatch.style.background = PALETTE[i % PALETTE.length];
      const first = row.insertCell();
      first.append(swatch, document.createTextNode(name));
      if (this.live && t?.console) {
        const button = h('button', 'jp-Button tfdist-lab-console-button', 'console');
        button.title = `a JupyterLab console (and debugger) on ${name}'s kernel`;
        first.appendChild(button);
      }
      const stepTime = t?.step_time_ms ?? medianStep(series);
      const step = t?.step ?? latest.step ?? null;
      const total = latest.total_steps ? ` / ${latest.total_steps}` : '';
      const lastOut = series.last_output ? `${Math.max(0, now - series.last_output).toFixed(0)} s ago` : '';
      const lateness = t?.lateness_ms ?? lastOf(series.lateness);
      const cells = [
        t?.state ?? '',
        step === null ? '' : `${step}${total}`,
        num(stepTime, 1, ' ms'),
        num(lateness, 0, ' ms'),
        num(latest.cpu_percent, 0, ' %'),
        num(latest.rss_mb, 0, ' MB'),
        t?.gpus ?? '',
        num(latest.gpu_util_percent, 0, ' %'),
        num(latest.gpu_mem_mb, 0, ' MB'),
        collectiveText(latest, now),
        lastOut
      ];
      cells.forEach((text, j) => {
        const cell = row.insertCell();
        cell.textContent = text;
        if (j === 0) {
          cell.className = 'tfdist-lab-task-state';
        }
      });
    });
  }

  private _renderCharts(): void {
    const tasks = this._tasks();
    this._legend.textContent = '';
    tasks.forEach((name, i) => {
      const item = h('span', 'tfdist-lab-legend-item', name);
      item.style.borderColor = PALETTE[i % PALETTE.length];
      this._legend.appendChild(item);
    });
    const now = Date.now() / 1000;
    // the axes the notebook widget draws too (one home: tfdist_nb/chart_axes.py)
    const served = new Map((this._detail?.charts ?? []).map(c => [c.key, c]));
    const windowS = this._detail?.window_s ?? 300;
    const gpus = tasks.some(name => ((this._series.get(name) || emptySeries()).latest.gpus ?? 0) > 0);
    for (const def of CHARTS) {
      const axes = served.get(def.key);
      const lines: ILine[] = tasks.map((name, i) => {
        let points = def.points(this._series.get(name) || emptySeries());
        if (def.xIsTime) {
          points = points
            .map(([x, y]) => [x - now, y] as [number, number])
            .filter(([x]) => x >= -windowS);
        }
        return { name, color: PALETTE[i % PALETTE.length], points };
      });
      const host = this._chartHosts.get(def.key)!;
      const title = this._chartTitles.get(def.key)!;
      if (axes && title.textContent !== axes.title) {
        title.textContent = axes.title;
      }
      const empty =
        def.key === 'gpu' && !gpus
          ? this._detail?.no_gpu ?? 'no GPU on this host'
          : axes?.empty ?? 'no data yet';
      if (lines.every(l => l.points.length === 0)) {
        host.textContent = '';
        host.appendChild(h('div', 'tfdist-lab-chart-empty', empty));
        continue;
      }
      drawChart(
        host,
        lines,
        def.xIsTime,
        def.floor ? def.floor(this._detail) : 0,
        axes?.top_at_least ?? 0,
        empty
      );
    }
  }

  private _renderLogs(force: boolean): void {
    const selected = this._taskFilter.value;
    const tasks = this._tasks();
    if (this._taskFilter.options.length !== tasks.length + 1) {
      this._taskFilter.textContent = '';
      this._taskFilter.appendChild(new Option('all tasks', ''));
      for (const t of tasks) {
        this._taskFilter.appendChild(new Option(t, t));
      }
      this._taskFilter.value = selected;
    }
    const task = this._taskFilter.value;
    const stream = this._streamFilter.value;
    let re: RegExp | null = null;
    this._grep.classList.remove('tfdist-lab-bad');
    if (this._grep.value) {
      try {
        re = new RegExp(this._grep.value, 'i');
      } catch {
        this._grep.classList.add('tfdist-lab-bad');
      }
    }
    const shown: ILogLine[] = [];
    for (let i = this._logs.length - 1; i >= 0 && shown.length < LOGS_SHOWN; i--) {
      const l = this._logs[i];
      if ((task && l.task !== task) || (stream && l.stream !== stream) || (re && !re.test(l.text))) {
        continue;
      }
      shown.push(l);
    }
    shown.reverse();
    const atBottom = this._log.scrollHeight - this._log.scrollTop - this._log.clientHeight < 20;
    this._log.textContent = '';
    for (const l of shown) {
      const line = h('div', `tfdist-lab-line tfdist-lab-stream-${l.stream}`);
      line.dataset.task = l.task;
      line.textContent = `[${l.task}] ${l.text}`;
      this._log.appendChild(line);
    }
    if (atBottom || force) {
      this._log.scrollTop = this._log.scrollHeight;
    }
  }
}

function medianStep(s: ISeries): Num {
  const recent = s.steps
    .slice(-20)
    .map(r => r[2])
    .filter((v): v is number => typeof v === 'number')
    .sort((a, b) => a - b);
  return recent.length ? recent[Math.floor(recent.length / 2)] : null;
}

function lastOf(rows: Num[][]): Num {
  return rows.length ? rows[rows.length - 1][1] : null;
}
