// What the HTTP side of inference needs from the engine; src/inference/engine implements it.

export interface ChatMessage {
  role: string;
  content: string;
}

export interface ServedModel {
  id: string;
  kind: 'chat' | 'evaluation';
  contextLength: number;
  maxTokensDefault: number;
  maxTokensCap: number;
  prices: { inputPerMTok: number; outputPerMTok: number };
  ownedBy: string;
  created: number;
}

export interface GenerateRequest {
  promptTokens: number[];
  maxTokens: number;
  temperature: number;
  topP: number;
  seed?: number;
  stop: string[];
  signal?: AbortSignal;
  /**
   * Called exactly once when the sequence ends (finished, cancelled or failed)
   * with the tokens really run: billing uses this, not what a client read.
   */
  onEnd?: (usage: { promptTokens: number; completionTokens: number }) => void;
}

export type GenerateEvent =
  | { type: 'delta'; text: string; tokenIds: number[] }
  | { type: 'done'; finishReason: 'stop' | 'length' | 'cancelled'; promptTokens: number; completionTokens: number };

/** A scored branch: it continues the shared prefix (parent -1) or an earlier branch. */
export interface BranchSpec {
  parent: number;
  tokens: number[];
}
