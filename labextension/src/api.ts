/**
 * The tfdist server extension's REST and websocket API (docs/reference.md, JupyterLab panes).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export type Num = number | null;

export interface ITaskSummary {
  task: string;
  role?: string | null;
  state: string;
  step: Num;
  pid?: Num;
  host?: string | null;
  step_time_ms?: Num;
  lateness_ms?: Num;
  straggler?: boolean | null;
  /** the GPUs the task was given (its CUDA_VISIBLE_DEVICES; "" none) */
  gpus?: string | null;
  /** a console can be opened on its kernel (it has a connection file on the server's host) */
  console?: boolean;
}

export interface IClusterSummary {
  id: string;
  spec: string;
  /** live | finished | orphaned | unknown */
  state: string;
  controller_state?: string | null;
  run_dir: string;
  started?: Num;
  updated?: Num;
  stopped?: Num;
  controller?: { pid?: Num; host?: string | null };
  tasks: ITaskSummary[];
  alerts: number;
  /** the alerts' texts (the stream's updates and the one-cluster answer carry them) */
  alert_list?: string[];
}

export interface ILogLine {
  time: Num;
  task: string;
  stream: string;
  text: string;
  cell?: Num;
  level?: string;
}

export interface ILatest {
  time?: Num;
  cpu_percent?: Num;
  rss_mb?: Num;
  gpu_util_percent?: Num;
  gpu_mem_mb?: Num;
  /** how many GPUs the task sees (0 on a host without GPUs) */
  gpus?: Num;
  step?: Num;
  total_steps?: Num;
  /** the collective the task is in (from its ledger), and since when */
  collective?: string | null;
  collective_since?: Num;
}

export interface ISeries {
  /** [time, cpu %, rss MB, gpu util %, gpu MB] */
  samples: Num[][];
  /** [step, begin, step ms, input wait ms] */
  steps: Num[][];
  /** [step, lateness ms] */
  lateness: Num[][];
  latest: ILatest;
  last_output: Num;
}

export interface IClusterDetail extends IClusterSummary {
  logs: ILogLine[];
  series: { [task: string]: ISeries };
  /** the smallest lag a task is flagged a straggler for (ms): the lateness chart's floor */
  lateness_floor_ms?: number;
  /** the charts' axes as the notebook widget draws them (tfdist_nb/chart_axes.py) */
  charts?: IChartAxes[];
  /** time charts: the whole run while shorter, else its last window_s seconds */
  window_s?: number;
  /** what the GPU chart says on a host without GPUs */
  no_gpu?: string;
}

export interface IChartAxes {
  key: string;
  title: string;
  /** the y axis starts at 0 and reaches at least this (100 for a percentage) */
  top_at_least: number;
  /** what the chart says while it has no data */
  empty: string;
}

export interface ISample extends ILatest {
  task: string;
  steps: Num[][];
  /** ledger rows sent between samples: no resource reading in it */
  ledger_only?: boolean;
}

export interface ILateness {
  task: string;
  step: number;
  lateness_ms: number;
}

export interface IUpdateMessage {
  type: 'update';
  cluster: IClusterSummary;
  events: ILogLine[];
  skipped: number;
  telemetry: ISample[];
  lateness: ILateness[];
}

export interface ISnapshotMessage {
  type: 'snapshot';
  cluster: IClusterDetail;
}

export type StreamMessage = IUpdateMessage | ISnapshotMessage;

const API = 'tfdist/api/clusters';

export async function requestAPI<T>(path = ''): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = path
    ? URLExt.join(settings.baseUrl, API, encodeURIComponent(path))
    : URLExt.join(settings.baseUrl, API);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return (await response.json()) as T;
}

/** The task's kernel, registered with the server for a console (tfdist_nb/lab/consoles.py). */
export async function openTaskKernel(cluster: string, task: string): Promise<{ kernel_id: string }> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API, encodeURIComponent(cluster), 'console');
  const init = { method: 'POST', body: JSON.stringify({ task }) };
  const response = await ServerConnection.makeRequest(url, init, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response, (await response.json()).message);
  }
  return (await response.json()) as { kernel_id: string };
}

export function streamUrl(id: string): string {
  const settings = ServerConnection.makeSettings();
  let url = URLExt.join(settings.wsUrl, API, encodeURIComponent(id), 'stream');
  if (settings.appendToken && settings.token) {
    url += `?token=${encodeURIComponent(settings.token)}`;
  }
  return url;
}

/** A cluster whose controller no longer runs: its panes only show what it left. */
export function isLive(summary: IClusterSummary | null): boolean {
  return summary !== null && summary.state === 'live';
}
