#!/usr/bin/env python3
"""Writes the PII tagger's training corpus and a held-out test set.

    pip install faker==40.63.0
    python3 crates/router/data/pii/make_corpus.py --out DIR

writes DIR/train.jsonl (what `straddle train-pii` learns from), DIR/gazetteer.tsv (first
names, surnames, cities and countries from Faker's locales in Latin script, and lower-case
English words from Debian's wamerican, which the tagger keeps as one Bloom filter) and DIR/heldout.jsonl (what `straddle eval pii` measures). Both are one `{"full_text", "spans": [{"entity_type",
"start_position", "end_position"}]}` object a line, offsets in code points, end exclusive.

The two share no sentence template and no name locale list: the held-out set's sentences
were written separately from the training templates, and half its people come from Faker
locales the training set never draws from, so a score on it says how the tagger does on
names and phrasings it has not seen. Values come from Faker (MIT), real city and country
names from the list below (facts). The same seed gives the same files.
"""

import argparse
import datetime
import json
import os
import random
import sys

from faker import Faker

TRAIN_LOCALES = ["en_US", "en_GB", "en_AU", "en_CA", "en_IE", "de_DE", "de_AT", "fr_FR",
                 "es_ES", "es_MX", "it_IT", "nl_NL", "pt_BR", "sv_SE", "pl_PL", "tr_TR",
                 "id_ID", "en_IN", "cs_CZ", "hu_HU"]
HELDOUT_ONLY_LOCALES = ["en_NZ", "de_CH", "fr_CA", "pt_PT", "da_DK", "no_NO", "fi_FI",
                        "ro_RO", "hr_HR", "sk_SK", "en_PH", "yo_NG"]
WORDS = "/usr/share/dict/american-english"  # apt-get install wamerican
ADDRESS_LOCALES = ["en_US", "en_US", "en_US", "en_GB", "en_AU", "en_CA"]
# Street formats beyond English: the tagger should know a street by its number and street
# word in the orders other countries write them ("Calle Mayor 12", "ul. Długa 5").
STREET_LOCALES = ["de_DE", "es_ES", "it_IT", "fr_FR", "nl_NL", "pt_BR", "pl_PL", "sv_SE",
                  "en_IN", "en_IE", "es_MX", "cs_CZ"]

REAL_CITIES = """New York|Los Angeles|Chicago|Houston|Phoenix|Philadelphia|San Antonio|San Diego|
Dallas|Austin|Seattle|Denver|Boston|Atlanta|Miami|Portland|Detroit|Nashville|Baltimore|
Springfield|Columbus|Cleveland|Pittsburgh|Minneapolis|Sacramento|Orlando|Tampa|Las Vegas|
London|Manchester|Birmingham|Leeds|Glasgow|Edinburgh|Bristol|Liverpool|Dublin|Cork|Paris|
Lyon|Marseille|Toulouse|Berlin|Hamburg|Munich|Cologne|Frankfurt|Stuttgart|Vienna|Zurich|
Geneva|Madrid|Barcelona|Valencia|Seville|Lisbon|Porto|Rome|Milan|Naples|Turin|Florence|
Amsterdam|Rotterdam|Brussels|Antwerp|Copenhagen|Stockholm|Oslo|Helsinki|Warsaw|Krakow|
Prague|Budapest|Athens|Istanbul|Ankara|Moscow|Kyiv|Cairo|Lagos|Nairobi|Johannesburg|
Cape Town|Toronto|Montreal|Vancouver|Ottawa|Calgary|Mexico City|Guadalajara|Bogota|Lima|
Santiago|Buenos Aires|Sao Paulo|Rio de Janeiro|Sydney|Melbourne|Brisbane|Perth|Auckland|
Wellington|Tokyo|Osaka|Seoul|Beijing|Shanghai|Hong Kong|Singapore|Bangkok|Jakarta|Manila|
Mumbai|Delhi|Bangalore|Chennai|Karachi|Dubai|Tel Aviv|Riyadh|Tehran""".replace("\n", "")
REAL_CITIES = REAL_CITIES.split("|")
REAL_COUNTRIES = """United States|Canada|Mexico|Brazil|Argentina|Chile|Colombia|Peru|United Kingdom|
Ireland|France|Germany|Spain|Portugal|Italy|Netherlands|Belgium|Switzerland|Austria|
Sweden|Norway|Denmark|Finland|Poland|Czech Republic|Hungary|Greece|Turkey|Russia|Ukraine|
Egypt|Nigeria|Kenya|South Africa|Morocco|India|Pakistan|China|Japan|South Korea|Vietnam|
Thailand|Indonesia|Philippines|Australia|New Zealand|Israel|Saudi Arabia|Iran|Iraq""".replace("\n", "")
REAL_COUNTRIES = REAL_COUNTRIES.split("|")

ORG_WORDS = ["Northern", "Blue Harbor", "Riverside", "Summit", "Golden Gate", "Redwood",
             "Pioneer", "Evergreen", "Silverline", "Oakwood", "Brightside", "Lakeshore",
             "Atlas", "Horizon", "Keystone", "Maple", "Orchard", "Crescent", "Union", "Metro"]
ORG_HEADS = ["Motors", "Cars", "Airlines", "Bank", "Clinic", "Hospital", "Dental", "Foods",
             "Traders", "Logistics", "Systems", "Labs", "Software", "Insurance", "University",
             "College", "Bakery", "Pharmacy", "Consulting", "Partners", "Media", "Energy",
             "Telecom", "Studios", "Hotels", "Realty", "Construction", "Legal", "Capital",
             "Foundation", "Council", "Academy", "Electric", "Textiles", "Brewing Co."]

# Training templates. Slots: {PERSON} {FIRST} {LAST} {CITY} {COUNTRY} {STATE} {ORG}
# {STREET} {PHONE} {EMAIL} {CARD} {DATE}. Sentences without slots teach what is not an
# entity (capitalised products, weekdays, languages, sentence starts).
TRAIN_TEMPLATES = """
Please write a short birthday message for {PERSON}.
Can you draft an email to {PERSON} about the meeting on Monday?
{PERSON} will join the call from {CITY} tomorrow.
I met {PERSON} at the conference in {CITY}, {COUNTRY}.
Send the invoice to {PERSON}, {STREET}, {CITY}.
Ship it to {STREET}, {CITY}, {STATE}.
My neighbour {FIRST} just moved to {CITY}.
Tell {FIRST} that the report is late.
Summarise this note from {PERSON}: the budget was approved.
{PERSON} works at {ORG} as a data analyst.
I have an interview with {ORG} next week in {CITY}.
Write a cover letter to {ORG} for a marketing role.
Hi, this is {PERSON} from {ORG}, calling about your order.
Dear {PERSON}, thank you for your application.
Dear Mr. {LAST}, your package has shipped.
Dear Ms. {LAST}, please find the contract attached.
Dr. {LAST} said the results look fine.
Please reschedule my appointment with Dr. {LAST}.
Our office is at {STREET} in {CITY}.
We are moving from {CITY} to {CITY} in June.
How far is {CITY} from {CITY}?
The flight to {COUNTRY} leaves at noon.
My sister {FIRST} lives in {COUNTRY} now.
{FIRST} and {FIRST} are coming to dinner on Friday.
Can you translate this letter for {PERSON}?
Remind me to call {FIRST} at {PHONE}.
Contact {PERSON} at {EMAIL} or {PHONE}.
The tenant {PERSON} lives at {STREET}, {CITY}.
Our new address is {STREET}, {CITY}, {STATE}.
Invoice from {ORG}, {STREET}, {CITY}.
{ORG} reported strong results this quarter.
I would like to cancel my subscription with {ORG}.
Write a complaint to {ORG} about a late delivery to {STREET}.
The package for {PERSON} was left at {STREET}.
Thanks {FIRST}, see you in {CITY}!
{FIRST}, can you check the slides before the meeting?
According to {PERSON}, the deadline moved to {DATE}.
{PERSON} was born in {CITY} and studied in {COUNTRY}.
Book a table for two under the name {PERSON}.
The patient {PERSON} was admitted on {DATE}.
Please update the record for {PERSON}, card {CARD}.
My manager {PERSON} approved the trip to {CITY}.
We hired {PERSON} as our new lead engineer.
{PERSON} from {CITY} won the local chess tournament.
Write a thank-you note to {FIRST} for the lovely gift.
Forward this to {PERSON} and {PERSON}.
My landlord {PERSON} never fixed the heating at {STREET}.
I live at {STREET} and work in {CITY}.
Please deliver to {STREET}, {CITY} {STATE}.
The meeting with {ORG} is at their {CITY} office.
{ORG} and {ORG} announced a merger.
Is {ORG} hiring in {COUNTRY}?
I need a reference letter for {PERSON}, who worked with me at {ORG}.
Hey {FIRST}! Long time no see.
Can you proofread my message to {PERSON}?
Our customer {PERSON} reported a bug in the app.
What time is it in {CITY} right now?
Plan a three-day trip to {CITY}, {COUNTRY}.
Compare the cost of living in {CITY} and {CITY}.
{CITY} is lovely in the spring.
The conference moved from {CITY} to {COUNTRY} this year.
Hotel booking for {PERSON}, check-in {DATE}.
Mail the documents to {PERSON} at {STREET}.
{PERSON} ({EMAIL}) asked for a refund.
Ask {PERSON} whether {ORG} signed the contract.
The shipment from {ORG} in {CITY} was delayed.
My son {FIRST} starts school in {CITY} next month.
Write a poem for my wife {FIRST}.
Say happy anniversary to {FIRST} and {FIRST}.
The driver will pick up {PERSON} at {STREET}.
The lease at {STREET} ends in {DATE}.
Visit us at {STREET}, {CITY}, {COUNTRY}.
Please call {PERSON} back on {PHONE}.
I am {PERSON} and I need help with my account.
My name is {PERSON}.
This is {FIRST}, I forgot my password.
Regards, {PERSON}
Best wishes,\n{PERSON}\n{ORG}
Cheers, {FIRST}
{PERSON}\n{STREET}\n{CITY}, {STATE}
Attn: {PERSON}, {ORG}
From: {PERSON} <{EMAIL}>
What is the capital of {COUNTRY}?
Which rivers flow through {COUNTRY}?
Explain how photosynthesis works.
Write a haiku about the sea.
How do I sort a list in Python?
What is the difference between TCP and UDP?
Give me three ideas for a Saturday afternoon.
Translate "good morning" into Spanish.
Summarise the plot of Hamlet in two sentences.
What causes the Northern Lights?
Write a SQL query that counts orders per day.
Is it better to rent or buy a house?
List five vegetables that grow well in winter.
How many planets are in the Solar System?
Why is the sky blue?
Recommend a good book about World War II.
Classify the sentiment of this review: The battery died after two days.
Is this message spam? Win a FREE cruise today!
What does HTTP status 404 mean?
Convert 5 miles to kilometres.
Explain the French Revolution in simple terms.
Write a function in JavaScript that reverses a string.
Which is faster, Rust or Go?
What should I pack for a week of hiking?
Tell me a joke about computers.
Monday's meeting is cancelled; we meet on Thursday instead.
The Apple Watch and the Google Pixel both track sleep.
Microsoft Excel can create pivot tables.
Christmas falls on a Friday this year.
Describe the water cycle for a ten-year-old.
Draft a polite reminder about the unpaid invoice.
Write a product description for a steel water bottle.
What are the symptoms of the common cold?
Please rate this answer from one to five.
Thank you so much, that helped a lot!
Can you make the tone more formal?
Rewrite this paragraph in the passive voice.
""".strip().split("\n")

# The held-out set: other people, other sentences.
HELDOUT_TEMPLATES = """
I just got off the phone with {PERSON}; she wants the figures by Thursday.
Could you help me write a farewell card for {PERSON}? She is leaving {ORG}.
{PERSON} asked me to send the keys to {STREET}, {CITY}.
The new hire, {PERSON}, starts on Monday in our {CITY} branch.
Remember that {FIRST} is allergic to peanuts.
Who is {PERSON}? I got a letter from them.
We spent last summer in {CITY} with {FIRST}.
Please let {PERSON} know the delivery to {STREET} failed.
{ORG} is opening a new store in {CITY}.
I'm writing on behalf of {ORG} regarding your complaint.
Reimburse {PERSON} for the taxi from {CITY}.
Text {FIRST} on {PHONE} when you land.
You can reach me on {PHONE} or at {EMAIL}.
Call me at {PHONE} after six.
Her card number is {CARD}, please charge it.
Charge {CARD} for the annual plan.
My SSN is {SSN}.
Wire it to {IBAN}.
The server at {IP} keeps timing out.
My driver's license number is {LICENSE}.
{PERSON} lives at {STREET}, {CITY}, {STATE}, and can be reached at {PHONE}.
Congratulate {PERSON} on the promotion at {ORG}.
Ask {FIRST} if she can cover my shift.
The parcel is addressed to {PERSON}, {STREET}.
My grandmother grew up in {COUNTRY} before moving to {CITY}.
Write a toast for {FIRST} and {FIRST}'s wedding.
Notes from the call with {PERSON} of {ORG}: pricing approved.
Schedule a visit to the {CITY} warehouse with {PERSON}.
I stayed at a hotel on {STREET} in {CITY}.
What's the weather like in {CITY} in October?
Our team in {COUNTRY} needs the report translated.
Can {ORG} deliver to {COUNTRY}?
Make a list of museums in {CITY}.
How do I reset my router?
Explain recursion with an example.
What is the boiling point of water at altitude?
Write a limerick about a cat.
Suggest a name for a bakery.
Summarise the main causes of inflation.
Give me a recipe for lentil soup.
Which programming language should I learn first?
What's a good stretching routine for the morning?
""".strip().split("\n")

# Frames: a lead-in and a tail around one entity, combined at random so the tagger learns
# an entity from itself and its near context rather than from whole memorised sentences.
FRAMES = {
    "PERSON": (["Please ask", "I talked to", "I owe", "Lunch with", "Happy birthday,",
                "Say hi to", "Meeting notes (attendees:", "Photos of", "Did you see",
                "Book a flight for", "She and", "Between you and", "Waiting for",
                "I went hiking with", "Where does", "Who was", "We had dinner with",
                "Coffee later with", "I'm worried about", "Does anyone know",
                "The kids stayed with", "Flowers for", "A note for", "Directions for", "Send a reminder to", "The report was written by",
                "I'm meeting", "Invite", "Do you know", "This came from", "We owe",
                "Assign the ticket to", "Thank", "Pick up", "It was", "My cousin",
                "The lawyer for", "Grades for", "A gift from", "Interview notes on",
                "I'll bring", "Nobody told", "Sign here,", "Order placed by", "Our guest is",
                "Can you find", "Introducing", "Message from"],
               ["today.", "about the budget.", "by Friday.", "and her team.", "soon?", ".",
                "before noon.", "as soon as possible.", "in person.", "next week.", "again?",
                "if possible.", "at the airport.", "— urgent.", "for the review.", "and me.",
                "tomorrow morning.", "this afternoon!", "with the kids.", "on Zoom.",
                "'s car is blue.", "'s address changed.", "; he agreed.", ": approved.",
                ", please call back.", "and his wife.", "or her manager.", ").",
                "live now?", "is on holiday.", "was late again.", "works nights.", "?"]),
    "CITY": (["I'm flying to", "The office in", "Weather for", "Hotels near", "We grew up in",
              "Shipping to", "Is it cold in", "A weekend in", "Rent prices in", "Trains from",
              "The branch in", "Restaurants in", "Our flat in", "Traffic around", "Drive to",
              "Greetings from", "The museum in", "Back home in", "Our stay in", "She was born in"],
             ["next month.", "this winter?", ".", "for two nights.", "is closed.", "seems busy.",
              "at night?", "by car.", "in July.", "on Sunday."]),
    "ORG": (["I applied to", "The contract with", "Shares of", "A refund from", "Support at",
             "My job at", "Invoice no. 44 from", "The CEO of", "A partnership with",
             "Complaints about", "Quarterly results of", "Email the team at"],
            ["was rejected.", "ends in May.", "fell again.", ".", "is slow.", "pays well.",
             "is attached.", "said no.", "looks promising.", "keeps growing."]),
    "STREET": (["Deliver to", "Her flat is at", "Meet me at", "The house at", "Parcel for",
                "We moved to", "The shop at", "Mail it to"],
               ["please.", "by six.", ".", "tomorrow.", "— ring twice.", "on Monday."]),
}
NEGATIVE = """in January|in February|in March|in April|in May|in June|in July|in August|
in September|in October|in November|in December|on Monday|on Tuesday|on Wednesday|
on Thursday|on Friday|on Saturday|on Sunday|My SSN|The API|The PDF|My PIN|The URL|The CEO|
Happy New Year|Good Morning|Best Regards|Kind regards|Thanks Again|See You Soon|
The Great Gatsby|Star Wars|Harry Potter|the Eiffel Tower|the Internet|English|Spanish|
German|Chinese|French|Python|JavaScript|Linux|Windows|Excel|Bluetooth|Wi-Fi|iPhone|Android|
Christmas|Easter|Ramadan|Thanksgiving|Halloween|Mother's Day|the Moon|the Sun|Mars|Jupiter""".replace("\n", "")
NEGATIVE = NEGATIVE.split("|")
# Titles, forms of address and roles: capitalised, often at a line's start, and never a
# place or an organisation on their own.
TITLES = """Dear Sir or Madam|Dear Hiring Manager|To Whom It May Concern|Your Honour|Your Excellency|
Madam Chair|Mr. President|Head of Marketing|Chief Financial Officer|Vice President of Sales|
Director of Operations|Senior Software Engineer|Team Lead|Product Owner|Customer Service|
Human Resources|Legal Department|Board of Directors|Professor Emeritus|Dean of Students|
Editor in Chief|Office Manager|Account Executive|Head Chef|Lead Nurse|Chief of Staff|
Sales Associate|Support Team|Admissions Office|Accounts Payable""".replace("\n", "")
TITLES = TITLES.split("|")
TITLE_FRAMES = ["{NEG},\nI am writing about the open position.", "{NEG}, thank you for your time.",
                "Please forward this to the {NEG}.", "Our {NEG} approved the plan.",
                "Role: {NEG}", "Write a job ad for a {NEG}.", "Attention: {NEG}",
                "The {NEG} will reply within two days.", "{NEG} - quarterly update"]
# Capitalised abstract nouns in lists (values, headings, slogans), read as organisations when
# the tagger has only ever seen capitals on names.
ABSTRACT = """Honesty|Integrity|Respect|Courage|Quality|Safety|Innovation|Teamwork|Excellence|
Trust|Diversity|Inclusion|Sustainability|Accountability|Growth|Leadership|Passion|Service|
Creativity|Transparency|Community|Wellbeing|Efficiency|Reliability|Curiosity|Kindness|
Security|Privacy|Performance|Simplicity""".replace("\n", "")
ABSTRACT = ABSTRACT.split("|")
ABSTRACT_FRAMES = ["Our values: {A}, {B} and {C}.", "{A}, {B}, {C} - pick two.",
                   "The three pillars are {A}, {B} and {C}.", "Slide 4: {A} and {B}",
                   "Write a paragraph on {A}, {B} and {C} at work.", "{A} • {B} • {C}",
                   "Rank these: {A}, {B}, {C}, {D}.", "Section headings: {A}; {B}; {C}."]
NEGATIVE_FRAMES = ["What happens {NEG}?", "Tell me about {NEG}.", "I love {NEG}!",
                   "Write a short poem about {NEG}.", "{NEG} is coming up.",
                   "Is {NEG} worth it?", "Explain {NEG} to a child.", "Plans {NEG}?"]


def frame(rng, values):
    """A sentence around one entity, or a sentence with capitalised words that are none."""
    if rng.random() < 0.2:
        return negative(rng)
    slot = rng.choice(list(FRAMES))
    lead, tail = FRAMES[slot]
    draw = "PERSON" if slot == "PERSON" and rng.random() < 0.6 else ("FIRST" if slot == "PERSON" else slot)
    text = f"{rng.choice(lead)} {{{draw}}} {rng.choice(tail)}"
    for mark in [" .", " '", " ;", " :", " ,", " )"]:
        text = text.replace(mark, mark[1:])
    return fill(text, values)


# Numbers beside capitalised words that are dates, events, products and titles, never a
# street: "On May 2, 2007", "Train No. 23", "Apollo 11".
NUMBERED = """Apollo 11|Route 66|Flight 370|Windows 11|Chapter 12|Train No. 23|Episode 4|
Interstate 95|Section 230|Article 50|Level 3|Season 2|Game 7|World War 2|Formula 1|Boeing 747|
Super Bowl 50|Catch-22|Ocean's 11|Studio 54|Blink-182|Matchbox 20|Vol. 3|Volume 2|Act 1|
Stage 4|Gate 12|Platform 9|Terminal 2|Highway 1""".replace("\n", "")
NUMBERED = NUMBERED.split("|")
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
NUMBERED_FRAMES = ["On {DATE}, the band announced {N}.", "{N} was released on {DATE}.",
                   "By {DATE} the {YEAR} {N} season had ended.", "What happened on {DATE}?",
                   "The {YEAR} final of {N} was close.", "Tell me about {N}.",
                   "Summarise the history of {N} since {YEAR}.", "{N} opens on {DATE}."]


def negative(rng):
    """A sentence whose capitalised words are no entity: dates, products, titles, values."""
    pick = rng.random()
    if pick < 0.5:
        text = rng.choice(NEGATIVE_FRAMES).replace("{NEG}", rng.choice(NEGATIVE))
    elif pick < 0.65:
        text = rng.choice(TITLE_FRAMES).replace("{NEG}", rng.choice(TITLES))
    elif pick < 0.8:
        year = str(rng.randint(1850, 2025))
        date = rng.choice([f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {year}",
                           f"{rng.choice(MONTHS)} {rng.randint(1, 28)}",
                           f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {year}",
                           f"{rng.choice(MONTHS)} {year}"])
        text = (rng.choice(NUMBERED_FRAMES).replace("{DATE}", date).replace("{YEAR}", year)
                .replace("{N}", rng.choice(NUMBERED)))
    else:
        words = rng.sample(ABSTRACT, 4)
        text = rng.choice(ABSTRACT_FRAMES)
        for slot, word in zip("ABCD", words):
            text = text.replace("{" + slot + "}", word)
    return {"full_text": text[0].upper() + text[1:], "spans": []}


class Values:
    """Draws slot values from Faker; `locales` are where people's names come from. `varied`
    draws names and streets in more shapes (training); the held-out set keeps the shapes it
    was written with, so the committed file stays reproducible."""

    def __init__(self, rng, locales, varied=False):
        self.rng = rng
        self.varied = varied
        self.people = [Faker(loc) for loc in locales]
        self.addresses = [Faker(loc) for loc in ADDRESS_LOCALES]
        self.local = [Faker(loc) for loc in ["de_DE", "es_ES", "it_IT", "fr_FR", "nl_NL", "en_GB"]]
        self.streets = self.addresses + [Faker(loc) for loc in STREET_LOCALES]
        self.us = Faker("en_US")

    def street(self):
        """A street address from one of many countries' formats, sometimes with a flat or
        suite. The town stays out of the span: the sentence names it as a place."""
        rng = self.rng
        source = rng.choice(self.addresses + self.local[:3]) if rng.random() < 0.7 else rng.choice(self.streets)
        pick = rng.random()
        if pick < 0.15 and hasattr(source, "secondary_address"):
            return f"{source.street_address()}, {source.secondary_address()}"
        return source.street_address().replace("\n", ", ").strip()

    def plain_org(self):
        """A name the way many real organisations are named: a surname, place or word and
        what the organisation does ("Harper Dental Clinic", "Riverside Motors")."""
        rng = self.rng
        word = rng.choice([lambda: rng.choice(self.people).last_name(),
                           lambda: rng.choice(REAL_CITIES),
                           lambda: rng.choice(ORG_WORDS)])()
        name = f"{word} {rng.choice(ORG_HEADS)}"
        if rng.random() < 0.2:
            name = f"{name} {rng.choice(['Inc.', 'Ltd', 'LLC', 'GmbH', 'plc', 'Group'])}"
        return name

    def person_name(self, person):
        """A full name in one of the ways people write one: Faker's own (with its titles and
        suffixes), first and last, a middle initial, surname first as forms do, or in capitals."""
        rng = self.rng
        first, last = person.first_name(), person.last_name()
        pick = rng.random()
        if pick < 0.4:
            return person.name()
        if pick < 0.7:
            return f"{first} {last}"
        if pick < 0.82:
            return f"{first} {rng.choice('ABCDEFGHJKLMNPRSTW')}. {last}"
        if pick < 0.94:
            return f"{last}, {first}"
        return f"{first} {last}".upper()

    def draw(self, slot):
        rng = self.rng
        person = rng.choice(self.people)
        if slot == "PERSON":
            if not self.varied:
                return rng.choice([person.name, person.name, lambda: f"{person.first_name()} {person.last_name()}"])(), "PERSON"
            return self.person_name(person), "PERSON"
        if slot == "FIRST":
            return person.first_name(), "PERSON"
        if slot == "LAST":
            return person.last_name(), "PERSON"
        if slot == "CITY":
            pick = rng.random()
            if pick < 0.4:
                return rng.choice(REAL_CITIES), "LOCATION"
            source = rng.choice(self.local) if pick < 0.7 else rng.choice(self.addresses)
            return source.city(), "LOCATION"
        if slot == "COUNTRY":
            return (rng.choice(REAL_COUNTRIES) if rng.random() < 0.6 else self.us.country()), "LOCATION"
        if slot == "STATE":
            return (self.us.state_abbr() if rng.random() < 0.5 else self.us.state()), "LOCATION"
        if slot == "ORG":
            if rng.random() < 0.4:
                return self.plain_org(), "ORGANIZATION"
            return rng.choice(self.people + self.local).company(), "ORGANIZATION"
        if slot == "STREET":
            if not self.varied:
                source = rng.choice(self.addresses + self.local[:3]) if rng.random() < 0.8 else rng.choice(self.local)
                return source.street_address().replace("\n", ", ").strip(), "STREET_ADDRESS"
            return self.street(), "STREET_ADDRESS"
        if slot == "PHONE":
            return rng.choice(self.addresses + self.local).phone_number(), "PHONE_NUMBER"
        if slot == "EMAIL":
            return person.email(), "EMAIL_ADDRESS"
        if slot == "CARD":
            return self.us.credit_card_number(), "CREDIT_CARD"
        if slot == "SSN":
            return self.us.ssn(), "US_SSN"
        if slot == "IBAN":
            return rng.choice(self.local).iban(), "IBAN_CODE"
        if slot == "IP":
            return (self.us.ipv4() if rng.random() < 0.7 else self.us.ipv6()), "IP_ADDRESS"
        if slot == "LICENSE":
            return self.us.bothify(rng.choice(["?#######", "#########", "?##-###-###", "??######"])).upper(), "US_DRIVER_LICENSE"
        if slot == "DATE":
            # A fixed end date: Faker's default is today, which would change the files daily.
            pattern = rng.choice(["%B %d", "%d %B %Y", "%Y-%m-%d"])
            return self.us.date(pattern=pattern, end_datetime=datetime.date(2026, 1, 1)), None
        raise KeyError(slot)


def fill(template, values):
    """The template with its slots filled, and the labelled spans (code point offsets)."""
    out, spans, i = "", [], 0
    template = template.replace("\\n", "\n")
    while i < len(template):
        if template[i] == "{":
            j = template.index("}", i)
            value, label = values.draw(template[i + 1:j])
            if label:
                spans.append({"entity_type": label, "start_position": len(out),
                              "end_position": len(out) + len(value)})
            out += value
            i = j + 1
        else:
            out += template[i]
            i += 1
    return {"full_text": out, "spans": spans}


def write(path, templates, locales, n, seed, frames=False, real_frames=None):
    rng = random.Random(seed)
    Faker.seed(seed)
    values = Values(rng, locales, varied=frames)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            row = frame(rng, values) if frames and rng.random() < 0.5 else fill(rng.choice(templates), values)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for row in real_frames or []:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            if any(s["entity_type"] in SUBSTITUTE for s in row["spans"]):
                f.write(json.dumps(substituted(row, values), ensure_ascii=False) + "\n")


# What an entity of a real sentence is replaced with: the sentence keeps its writer's style,
# the tagger sees names from every training locale in it.
SUBSTITUTE = {"PERSON": "PERSON", "LOCATION": "CITY", "ORGANIZATION": "ORG"}


def substituted(row, values):
    """A real sentence with its people, places and organisations replaced by drawn ones."""
    text, spans, last = "", [], 0
    for s in sorted(row["spans"], key=lambda s: s["start_position"]):
        a, b = s["start_position"], s["end_position"]
        text += row["full_text"][last:a]
        value, label = (values.draw(SUBSTITUTE[s["entity_type"]]) if s["entity_type"] in SUBSTITUTE
                        else (row["full_text"][a:b], s["entity_type"]))
        spans.append({"entity_type": label, "start_position": len(text),
                      "end_position": len(text) + len(value)})
        text += value
        last = b
    return {"full_text": text + row["full_text"][last:], "spans": spans}


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def latin(word):
    return all(ord(c) < 0x250 or not c.isalpha() for c in word)


def write_gazetteer(path):
    """Every Latin-script first name, surname and city Faker knows, and the countries, less
    the held-out set's own locales: its people from those are names the tagger never saw."""
    import faker.config
    classes = {"given": set(), "surname": set(), "city": set(), "country": set(), "word": set()}
    # Lower-case English words (Debian's wamerican, SCOWL): a capitalised word that is one
    # ("Reimburse", "Remember") is more often a sentence start than a name.
    with open(WORDS, encoding="utf-8") as f:
        classes["word"].update(w.strip() for w in f if w.strip().isalpha() and w.strip().islower() and len(w.strip()) > 1)
    for loc in faker.config.AVAILABLE_LOCALES:
        if loc in HELDOUT_ONLY_LOCALES:
            continue
        try:
            fake = Faker(loc)
            person = fake.provider("faker.providers.person")
            address = fake.provider("faker.providers.address")
        except (AttributeError, ValueError):
            continue
        for attr, cls in [("first_names", "given"), ("first_names_female", "given"),
                          ("first_names_male", "given"), ("last_names", "surname"),
                          ("cities", "city"), ("city_names", "city")]:
            source = person if cls != "city" else address
            names = getattr(source, attr, None) or []
            classes[cls].update(n.lower() for n in names if latin(n) and len(n) > 1)
    classes["city"].update(c.lower() for c in REAL_CITIES)
    classes["country"].update(c.lower() for c in REAL_COUNTRIES)
    classes["country"].update(c.lower() for c in Faker("en_US").provider("faker.providers.address").countries)
    with open(path, "w", encoding="utf-8") as f:
        for cls, names in classes.items():
            for name in sorted(names):
                f.write(f"{cls}\t{name}\n")


def markup_to_jsonl(src, dst):
    """Converts hand-written `[[TYPE:value]]` markup, one text a line, to the corpus shape."""
    import re
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            text, spans, last = "", [], 0
            line = line.rstrip("\n")
            for m in re.finditer(r"\[\[([A-Z_]+):(.+?)\]\]", line):
                text += line[last:m.start()]
                spans.append({"entity_type": m.group(1), "start_position": len(text),
                              "end_position": len(text) + len(m.group(2))})
                text += m.group(2)
                last = m.end()
            text += line[last:]
            out.write(json.dumps({"full_text": text, "spans": spans}, ensure_ascii=False) + "\n")


def main():
    # Faker's city lists pass through sets somewhere, so string hashing must be pinned for
    # the same seed to give the same files.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--train", type=int, default=24000)
    p.add_argument("--heldout", type=int, default=1500)
    p.add_argument("--real-frames", metavar="JSONL",
                   help="real labelled sentences to learn from as they are and with their "
                        "entities replaced (outside/train_frames.jsonl; never a test corpus)")
    p.add_argument("--markup", nargs=2, metavar=("SRC", "DST"),
                   help="only convert hand-written markup (handwritten.txt) to JSON lines")
    args = p.parse_args()
    if args.markup:
        markup_to_jsonl(*args.markup)
        return
    os.makedirs(args.out, exist_ok=True)
    real = read_jsonl(args.real_frames) if args.real_frames else None
    write(f"{args.out}/train.jsonl", TRAIN_TEMPLATES, TRAIN_LOCALES, args.train, 1, frames=True,
          real_frames=real)
    write_gazetteer(f"{args.out}/gazetteer.tsv")
    heldout_locales = HELDOUT_ONLY_LOCALES + TRAIN_LOCALES[:6]
    write(f"{args.out}/heldout.jsonl", HELDOUT_TEMPLATES, heldout_locales, args.heldout, 2)


if __name__ == "__main__":
    main()
