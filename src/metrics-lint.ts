// The rules of `promtool check metrics` (Prometheus client_golang's promlint),
// applied to exposition text, so CI checks what promtool would without having
// it installed. Each problem reads like promtool's: `name: text`.
//
// The one exemption is asked for by name: `vllm:` families on the inference
// port carry vLLM's own names (what vLLM dashboards and the Gateway API
// Inference Extension's endpoint picker read), and promlint reports colons in
// any metric name ("reserved for recording rules"), vLLM's own output included.

export interface LintProblem {
  metric: string;
  text: string;
}

interface Family {
  name: string;
  type: string;
  help: string | undefined;
  labels: Set<string>;
}

/** promlint's base units and the prefixes that make a non-base unit of them. */
const BASE_UNITS = ['amperes', 'bytes', 'celsius', 'grams', 'joules', 'kelvin', 'meters', 'metres', 'seconds', 'volts'];
const UNIT_PREFIXES = ['pico', 'nano', 'micro', 'milli', 'centi', 'deci', 'deca', 'hecto', 'kilo', 'kibi', 'mega', 'mibi', 'giga', 'gibi', 'tera', 'tebi', 'peta', 'pebi'];
/** Units promlint wants as another base unit. */
const WRONG_BASE: Record<string, string> = { minutes: 'seconds', hours: 'seconds', days: 'seconds', weeks: 'seconds', celsius: 'kelvin', fahrenheit: 'kelvin', percent: 'ratios' };
const UNIT_ABBREVIATIONS = new Set(['s', 'ms', 'us', 'ns', 'sec', 'b', 'kb', 'mb', 'gb', 'tb', 'pb', 'm', 'h', 'd']);
const CAMEL = /[a-z][A-Z]/;

/** Families of an exposition text: names from `# TYPE`/`# HELP`, label names from the samples. */
export function parseFamilies(text: string): Family[] {
  const fams = new Map<string, Family>();
  const fam = (name: string) => {
    let f = fams.get(name);
    if (!f) fams.set(name, (f = { name, type: 'untyped', help: undefined, labels: new Set() }));
    return f;
  };
  let last: Family | undefined;
  for (const line of text.split('\n')) {
    if (!line) continue;
    const meta = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
    if (meta) {
      const f = fam(meta[2]!);
      if (meta[1] === 'HELP') f.help = meta[3] ?? '';
      else f.type = meta[3] ?? 'untyped';
      last = f;
      continue;
    }
    if (line.startsWith('#')) continue;
    const m = /^([^\s{]+)(?:\{(.*)\})?\s/.exec(line);
    if (!m) continue;
    const sample = m[1]!;
    // A histogram's or summary's samples carry suffixes of the family last declared.
    const f = last && (sample === last.name || sample.startsWith(`${last.name}_`)) ? last : fam(sample);
    for (const lm of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)) f.labels.add(lm[1]!);
  }
  return [...fams.values()];
}

function lintFamily(f: Family, exemptColons: (name: string) => boolean): string[] {
  const out: string[] = [];
  const n = f.name;
  if (f.help === undefined || f.help === '') out.push('no help text');
  for (const p of n.split('_')) {
    for (const base of BASE_UNITS) {
      for (const pre of UNIT_PREFIXES) if (p === pre + base) out.push(`use base unit "${base}" instead of "${p}"`);
    }
    if (WRONG_BASE[p]) out.push(`use base unit "${WRONG_BASE[p]}" instead of "${p}"`);
  }
  const lower = n.toLowerCase();
  for (const a of UNIT_ABBREVIATIONS) {
    if (lower.includes(`_${a}_`) || lower.endsWith(`_${a}`)) out.push('metric names should not contain abbreviated units');
  }
  if (f.type === 'counter' && !n.endsWith('_total')) out.push('counter metrics should have "_total" suffix');
  if (f.type !== 'counter' && n.endsWith('_total')) out.push('non-counter metrics should not have "_total" suffix');
  if (f.type !== 'histogram' && f.type !== 'summary') {
    for (const suf of ['_count', '_sum']) if (n.endsWith(suf)) out.push(`non-histogram and non-summary metrics should not have "${suf}" suffix`);
  }
  if (f.type !== 'histogram') {
    if (n.endsWith('_bucket')) out.push('non-histogram metrics should not have "_bucket" suffix');
    if (f.labels.has('le')) out.push('non-histogram metrics should not have "le" label');
  }
  if (f.type !== 'summary' && f.labels.has('quantile')) out.push('non-summary metrics should not have "quantile" label');
  if (f.type !== 'untyped' && (lower.includes(`_${f.type}_`) || lower.endsWith(`_${f.type}`))) out.push(`metric name should not include type '${f.type}'`);
  if (n.includes(':') && !exemptColons(n)) out.push("metric names should not contain ':'");
  if (CAMEL.test(n)) out.push("metric names should be written in 'snake_case' not 'camelCase'");
  for (const l of f.labels) if (CAMEL.test(l)) out.push("label names should be written in 'snake_case' not 'camelCase'");
  return out;
}

/** Every problem promtool would report for this text, less colons in the names `exemptColons` accepts. */
export function lintMetrics(text: string, exemptColons: (name: string) => boolean = () => false): LintProblem[] {
  return parseFamilies(text).flatMap((f) => lintFamily(f, exemptColons).map((t) => ({ metric: f.name, text: t })));
}

/** The series of an exposition text (name and sorted labels), for checking two ports share none. */
export function seriesOf(text: string): string[] {
  const out: string[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([^\s{]+)(?:\{(.*)\})?\s/.exec(line);
    if (!m) continue;
    const labels = [...(m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)].map((x) => `${x[1]}=${x[2]}`).sort();
    out.push(`${m[1]}{${labels.join(',')}}`);
  }
  return out;
}
