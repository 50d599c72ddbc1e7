/**
 * The output of ``%tfdist_status --lab``: a ``application/vnd.tfdist.lab+json`` bundle. Its
 * renderer opens the cluster's pane once (the bundle's nonce is remembered, so reopening the
 * notebook later does not open it again) and shows a button to open it by hand.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

export const MIME_TYPE = 'application/vnd.tfdist.lab+json';
const SEEN_KEY = 'tfdist-nb:opened';
const FRESH_S = 600;

interface IOpenRequest {
  cluster: string;
  nonce?: string;
  time?: number;
}

function seen(nonce: string): boolean {
  try {
    const list: string[] = JSON.parse(window.localStorage.getItem(SEEN_KEY) || '[]');
    if (list.includes(nonce)) {
      return true;
    }
    list.push(nonce);
    window.localStorage.setItem(SEEN_KEY, JSON.stringify(list.slice(-100)));
  } catch {
    // no storage: the freshness check alone decides
  }
  return false;
}

class OpenRenderer extends Widget implements IRenderMime.IRenderer {
  constructor(private readonly _commands: CommandRegistry, private readonly _command: string) {
    super();
    this.addClass('tfdist-lab-opener');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[MIME_TYPE] as unknown as IOpenRequest;
    const id = String(data?.cluster || '');
    this.node.textContent = '';
    const text = document.createElement('span');
    text.textContent = `tfdist_nb: cluster ${id} `;
    const button = document.createElement('button');
    button.className = 'jp-Button tfdist-lab-open-button';
    button.textContent = 'open its pane';
    button.onclick = () => void this._commands.execute(this._command, { id });
    this.node.append(text, button);
    const fresh = typeof data?.time === 'number' && Math.abs(Date.now() / 1000 - data.time) < FRESH_S;
    if (id && model.trusted && fresh && data.nonce && !seen(data.nonce)) {
      void this._commands.execute(this._command, { id });
    }
  }
}

export function openerFactory(commands: CommandRegistry, command: string): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [MIME_TYPE],
    defaultRank: 10,
    createRenderer: () => new OpenRenderer(commands, command)
  };
}
