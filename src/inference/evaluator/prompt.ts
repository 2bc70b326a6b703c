import type { Question } from '../protocol.js';

// The text an evaluation model reads. The state is written once (the shared
// prefix); each question is a continuation of it that ends where the answer
// starts. Answers are scored as continuations, never generated.

/** Choice option listings are rotated this many times at most and averaged, to cancel position bias. */
export const CHOICE_ROTATIONS_MAX = 3;

const asText = (v: unknown): string => (typeof v === 'string' ? v : JSON.stringify(v));

/** The text every question starts with; it ends the shared prefix, so questions do not pay for it. */
export const QUESTION_LEAD = '\nQ:';

// Everything every question shares sits in the prefix, run once; each
// question adds only its own words (its tokens are the per-question cost).
export function prefixText(state: unknown): string {
  return (
    'You are an evaluator. Read the state, then answer each question about it. ' +
    'Answer yes/no questions with yes or no, option questions with one option name, and rating questions with a number.\n\n' +
    `State:\n${asText(state)}\n${QUESTION_LEAD}`
  );
}

/** Answer words for booleans, tried in order: the first pair that is one token each is used. */
export const BOOLEAN_WORDS: Array<[string, string]> = [
  ['yes', 'no'],
  ['Yes', 'No'],
  ['true', 'false'],
  ['y', 'n'],
];

export interface Alternative {
  /** The answer key: option name, "0".."N-1" for scores, "true"/"false" for booleans. */
  key: string;
  /** The words the model would write as its answer. */
  text: string;
}

export interface QuestionPlan {
  alternatives: Alternative[];
  /** One question text per rotation of the option listing, continuing QUESTION_LEAD; their answer distributions are averaged. */
  texts: string[];
}

export type Detail = 'full' | 'names' | 'none';

/**
 * Plans a question. `detail` shrinks the listing when the full one would not
 * fit the model's context (255 described options do not fit a 512-token model):
 * options are still scored by their names, they are just not all listed.
 */
export function planQuestion(q: Question, detail: Detail, booleanWords: [string, string] = BOOLEAN_WORDS[0]!): QuestionPlan {
  const ask = q.instructions == null ? '' : ` ${asText(q.instructions)}`;
  switch (q.type) {
    case 'boolean': {
      const c = q.criteria ?? {};
      const [yes, no] = booleanWords;
      const meaning =
        detail === 'full' && (c.true != null || c.false != null)
          ? `${c.true != null ? ` ${yes}: ${asText(c.true)}.` : ''}${c.false != null ? ` ${no}: ${asText(c.false)}.` : ''}`
          : '';
      return {
        alternatives: [
          { key: 'true', text: yes },
          { key: 'false', text: no },
        ],
        texts: [`${ask}${meaning}\nA:`],
      };
    }
    case 'score': {
      const levels = q.criteria.map((d, i) => `${i}: ${asText(d)}`).join('\n');
      const n = q.criteria.length;
      const listing = detail === 'full' ? `\n${levels}` : '';
      return {
        alternatives: q.criteria.map((_, i) => ({ key: String(i), text: String(i) })),
        texts: [`${ask} Rate from 0 (lowest) to ${n - 1} (highest).${listing}\nA:`],
      };
    }
    case 'choice': {
      const names = Object.keys(q.criteria);
      const line = (name: string) => {
        const d = q.criteria[name];
        return detail === 'full' && d != null ? `- ${name}: ${asText(d)}` : `- ${name}`;
      };
      const rotations = detail === 'none' ? 1 : Math.min(names.length, CHOICE_ROTATIONS_MAX);
      const texts: string[] = [];
      for (let r = 0; r < rotations; r++) {
        // Evenly spaced starting points, so each option appears early in some listing.
        const start = Math.floor((r * names.length) / rotations);
        const order = [...names.slice(start), ...names.slice(0, start)];
        const listing = detail === 'none' ? '' : `\nOptions:\n${order.map(line).join('\n')}`;
        texts.push(`${ask}${listing}\nA:`);
      }
      return { alternatives: names.map((n) => ({ key: n, text: n })), texts };
    }
  }
}
