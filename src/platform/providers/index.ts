import type { Sql } from '../../db/index.js';
import type { Provider } from './provider.js';
import { SimulatedProvider } from './simulated.js';

/** Which driver a provider row names is re-read at most this often (admin import can change it). */
const DRIVER_CACHE_TTL_MS = 10_000;

/** Drivers by name (providers.driver). Only the simulation ships; a real cloud adds an entry. */
export class Providers {
  private readonly drivers = new Map<string, Provider>();
  private driverOf = new Map<string, string>();
  private loadedAt = 0;

  constructor(
    private readonly sql: Sql,
    timeScale: number,
  ) {
    this.drivers.set('simulated', new SimulatedProvider(timeScale));
  }

  get(driver: string): Provider {
    const p = this.drivers.get(driver);
    if (!p) throw new Error(`no provider driver named ${JSON.stringify(driver)}`);
    return p;
  }

  /** The driver for a provider id (providers.id). */
  async forProvider(providerId: string): Promise<Provider> {
    let d = this.driverOf.get(providerId);
    if (d === undefined || Date.now() - this.loadedAt > DRIVER_CACHE_TTL_MS) {
      const rows = await this.sql<{ id: string; driver: string }[]>`SELECT id, driver FROM providers`;
      this.driverOf = new Map(rows.map((r) => [r.id, r.driver]));
      this.loadedAt = Date.now();
      d = this.driverOf.get(providerId);
    }
    if (d === undefined) throw new Error(`unknown provider ${JSON.stringify(providerId)}`);
    return this.get(d);
  }
}
