import type { ApiFamily } from '../errors.js';
import { errorBody, jsonSchema } from './openapi.js';
import { responseKinds, type Route } from './router.js';

// CHECK_RESPONSE_SCHEMAS=1: every answer is checked against the JSON Schema /openapi.json
// declares for its route and status (errors against the family's error body), by a real
// JSON Schema validator (ajv, a development dependency: this is a test mode). The end-to-end
// suite runs its daemons this way, so a response that drifts from its declaration fails it.

type Validate = ((data: unknown) => boolean) & { errors?: Array<{ instancePath: string; message?: string }> | null };
interface Compiler {
  compile(schema: object): Validate;
}

export class ResponseCheck {
  private readonly validators = new Map<string, Validate>();

  private constructor(private readonly ajv: Compiler) {}

  static async create(): Promise<ResponseCheck> {
    let Ajv2020: new (o: object) => Compiler;
    try {
      Ajv2020 = ((await import('ajv/dist/2020.js')) as unknown as { default: new (o: object) => Compiler }).default;
    } catch {
      throw new Error('CHECK_RESPONSE_SCHEMAS needs the ajv package (a development dependency: run npm ci without --omit=dev)');
    }
    // Formats (email, date-time) are not checked: the shape is what drifts.
    return new ResponseCheck(new Ajv2020({ strict: false, validateFormats: false, allErrors: false }));
  }

  /** Why a whole answer breaks its declaration, or undefined when it keeps it. */
  check(route: Route | undefined, family: ApiFamily, status: number, contentType: string, body: string | Buffer): string | undefined {
    const doc = route?.doc.responses[status];
    // An error the route does not declare itself is the family's error body.
    if (!doc && status >= 400) return this.json(`error ${family}`, () => jsonSchema(errorBody(family), 'output'), body);
    if (!route) return `status ${status} from no route`;
    if (!doc) return `status ${status} is not declared (declared: ${Object.keys(route.doc.responses).join(', ')})`;
    const k = responseKinds(doc);
    if (contentType.startsWith('application/json') && k.json) return this.json(`${route.method} ${route.path} ${status}`, () => jsonSchema(k.json!, 'output'), body);
    if (status === 204 || (k.empty && body.length === 0)) return k.empty ? undefined : `an empty answer is not declared`;
    if (k.text && contentType.startsWith(k.text)) return undefined;
    return `content type ${contentType} is not declared`;
  }

  /** Why one server-sent event's data breaks the stream's declaration (an error event is the family's error body). */
  checkEvent(route: Route | undefined, family: ApiFamily, data: string): string | undefined {
    const doc = route?.doc.responses[200];
    const sse = doc && responseKinds(doc).sse;
    if (!route || !sse) return 'a stream is not declared';
    if (data.startsWith('{"error"')) return this.json(`error ${family}`, () => jsonSchema(errorBody(family), 'output'), data);
    return this.json(`${route.method} ${route.path} sse`, () => jsonSchema(sse, 'output'), data);
  }

  private json(key: string, schema: () => object, body: string | Buffer): string | undefined {
    let v = this.validators.get(key);
    if (!v) this.validators.set(key, (v = this.ajv.compile(schema())));
    let value: unknown;
    try {
      value = JSON.parse(body.toString());
    } catch {
      return 'the body is not JSON';
    }
    if (v(value)) return undefined;
    const e = v.errors?.[0];
    return `${e?.instancePath || '(root)'} ${e?.message ?? 'does not match'}`;
  }
}
